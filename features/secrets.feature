Feature: Secrets for inline volumes
  nodePublishSecretRef names a secret in the pod's own namespace; the kubelet reads only the secrets a
  volume references, passes every key of data as a string, and never shows a value.

  Background:
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      """

  Scenario: The secret is read from the pod's namespace only, and only because it is referenced
    Given the manifests:
      """
      apiVersion: v1
      kind: Secret
      metadata: {name: creds, namespace: team-a}
      stringData: {username: demo, password: s3cr3t-password}
      ---
      apiVersion: v1
      kind: Secret
      metadata: {name: creds, namespace: default}
      stringData: {other: value}
      ---
      apiVersion: v1
      kind: Secret
      metadata: {name: unrelated, namespace: team-a}
      stringData: {x: "y"}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web, namespace: team-a}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}, {name: plain, mountPath: /plain}]}]
        volumes:
          - {name: data, csi: {driver: local.inlet.dev, nodePublishSecretRef: {name: creds}}}
          - {name: plain, csi: {driver: local.inlet.dev}}
      """
    When the simulation runs
    Then pod "web" is Running
    And the only secrets read were "team-a/creds"
    And the publish of "data" in pod "web" has secret keys "password,username"
    And the publish of "plain" in pod "web" has secret keys ""
    And no report, log or call carries a secret value

  Scenario: A missing secret is a transient FailedMount, and the mount goes through once it appears
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, nodePublishSecretRef: {name: late}}}]
      """
    When the simulation runs
    Then pod "web" is Pending
    And pod "web" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "data" : fetching NodePublishSecretRef default/late failed: secrets "late" not found"
    And the driver got no NodePublishVolume call
    When these manifests are applied:
      """
      apiVersion: v1
      kind: Secret
      metadata: {name: late}
      stringData: {token: s3cr3t-password}
      """
    Then pod "web" becomes Running
    And the publish of "data" in pod "web" has secret keys "token"
