Feature: Pod information and service-account tokens on mount
  With podInfoOnMount the kubelet adds csi.storage.k8s.io/pod.* and ephemeral keys to the volume context,
  overwriting user attributes of the same name; without it, none. Tokens come from tokenRequests,
  whatever podInfoOnMount says, and never reach the report.

  Scenario: contain ephemeral=true when using inline volume
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      podInfoOnMount: true
      """
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web, namespace: team-a}
      spec:
        serviceAccountName: default
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And the publish of "data" in pod "web" has volume context "csi.storage.k8s.io/ephemeral" = "true"
    And the publish of "data" in pod "web" has volume context "csi.storage.k8s.io/pod.name" = "web"
    And the publish of "data" in pod "web" has volume context "csi.storage.k8s.io/pod.namespace" = "team-a"
    And the publish of "data" in pod "web" has volume context "csi.storage.k8s.io/serviceAccount.name" = "default"

  Scenario: should not be passed when podInfoOnMount=false
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      podInfoOnMount: false
      """
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And the publish of "data" in pod "web" has no volume context key starting with "csi.storage.k8s.io/pod"
    And the publish of "data" in pod "web" has no volume context key starting with "csi.storage.k8s.io/ephemeral"

  Scenario: Kubelet keys overwrite user attributes of the same name
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      podInfoOnMount: true
      """
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes:
          - name: data
            csi:
              driver: local.inlet.dev
              volumeAttributes: {csi.storage.k8s.io/pod.name: spoofed, size: 16Mi}
      """
    When the simulation runs
    Then pod "web" is Running
    And the publish of "data" in pod "web" has volume context "csi.storage.k8s.io/pod.name" = "web"
    And the publish of "data" in pod "web" has volume context "size" = "16Mi"

  Scenario: tokenRequests give service-account tokens, redacted in the report
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      tokenRequests: [{audience: vault, expirationSeconds: 3600}]
      """
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And the publish of "data" in pod "web" has a token for audience "vault" expiring on a whole second, RFC 3339 in UTC
    And the publish of "data" in pod "web" has no volume context key starting with "csi.storage.k8s.io/pod"
    And no report, log or call carries a secret value

  Scenario: serviceAccountTokenInSecrets puts the tokens in the secrets, not the volume context
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      tokenRequests: [{audience: vault, expirationSeconds: 3600}]
      serviceAccountTokenInSecrets: true
      """
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And the publish of "data" in pod "web" has secret keys "csi.storage.k8s.io/serviceAccount.tokens"
    And the publish of "data" in pod "web" has no volume context key starting with "csi.storage.k8s.io/serviceAccount"
    And no report, log or call carries a secret value

  Scenario: requiresRepublish publishes the volume again periodically
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Persistent, Ephemeral]
      requiresRepublish: true
      """
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And the driver published "data" of pod "web" at least 3 times
