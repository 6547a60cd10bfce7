Feature: Projected and downwardAPI volumes, and the service-account token every pod carries
  Since 1.21 the API server's ServiceAccount admission gives every pod that does not opt out a projected
  `kube-api-access-<5 chars>` volume (`plugin/pkg/admission/serviceaccount/admission.go`): a token bound to
  the pod (`serviceAccountToken`, 3607 s), the root CA from the `kube-root-ca.crt` ConfigMap, and the
  namespace through the downward API, mounted read-only at `/var/run/secrets/kubernetes.io/serviceaccount`.
  The kubelet writes projected and downwardAPI volumes on a tmpfs with the AtomicWriter, again on every pass
  (`pkg/volume/projected`, `pkg/volume/downwardapi`); its token manager (`pkg/kubelet/token`) asks
  TokenRequest for a new token once 80% of the old one's life has passed, keeps the old one while it is valid
  if that fails, and forgets a pod's tokens with the pod.

  Scenario: A plain pod gets kube-api-access: a bound token the API accepts, the root CA, its namespace
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, command: [sleep, "3600"]}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: opted-out}
      spec:
        automountServiceAccountToken: false
        containers: [{name: app, image: busybox, command: [sleep, "3600"]}]
      """
    When the simulation runs
    Then pod "web" is Running
    And pod "web" has a projected volume "kube-api-access-" and 5 characters
    And container "app" of pod "web" mounts "/var/run/secrets/kubernetes.io/serviceaccount" read-only
    And the token at "/var/run/secrets/kubernetes.io/serviceaccount:token" of pod "web" authenticates as "system:serviceaccount:default:default" for audience "https://kubernetes.default.svc.cluster.local", bound to the pod and its node
    And the token at "/var/run/secrets/kubernetes.io/serviceaccount:token" of pod "web" is signed for a year, warning after 3607 s
    And the file "/var/run/secrets/kubernetes.io/serviceaccount:..data/token" of pod "web" has mode 644
    And pod "web" reads a PEM certificate at "/var/run/secrets/kubernetes.io/serviceaccount:ca.crt"
    And pod "web" reads "default" at "/var/run/secrets/kubernetes.io/serviceaccount:namespace"
    And "/var/run/secrets/kubernetes.io/serviceaccount" of pod "web" is on a tmpfs
    And pod "opted-out" is Running
    And pod "opted-out" has no service account token volume
    And the token at "/var/run/secrets/kubernetes.io/serviceaccount:token" of pod "web" is noted
    When pod "web" is deleted
    Then the noted token is refused for audience "https://kubernetes.default.svc.cluster.local"
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A service account that opts out, or a pod that mounts its own token path, gets no injected volume
    Given the manifests:
      """
      apiVersion: v1
      kind: ServiceAccount
      metadata: {name: quiet}
      automountServiceAccountToken: false
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: quiet}
      spec:
        serviceAccountName: quiet
        containers: [{name: app, image: busybox}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: own}
      spec:
        containers:
        - name: app
          image: busybox
          volumeMounts: [{name: mine, mountPath: /var/run/secrets/kubernetes.io/serviceaccount}]
        volumes: [{name: mine, emptyDir: {}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: nobody}
      spec:
        serviceAccountName: ghost
        containers: [{name: app, image: busybox}]
      """
    When the simulation runs
    Then pod "quiet" is Running
    And pod "quiet" has no service account token volume
    And pod "own" is Running
    And pod "own" has no service account token volume
    And pod "nobody" was rejected with "pods "nobody" is forbidden: error looking up service account default/ghost: serviceaccount "ghost" not found"

  Scenario: A downwardAPI volume holds the pod's fields and resources, and follows its labels
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata:
        name: web
        labels: {app: web, tier: front}
        annotations: {note: "say \"hi\""}
      spec:
        automountServiceAccountToken: false
        containers:
        - name: app
          image: busybox
          resources: {requests: {cpu: 250m, memory: 64Mi}, limits: {memory: 128Mi}}
          volumeMounts: [{name: info, mountPath: /info}]
        volumes:
        - name: info
          downwardAPI:
            defaultMode: 288
            items:
            - {path: labels, fieldRef: {fieldPath: metadata.labels}}
            - {path: app, fieldRef: {fieldPath: "metadata.labels['app']"}}
            - {path: notes/all, fieldRef: {fieldPath: metadata.annotations}, mode: 256}
            - {path: name, fieldRef: {fieldPath: metadata.name}}
            - {path: cpu, resourceFieldRef: {containerName: app, resource: requests.cpu, divisor: 1m}}
            - {path: memory, resourceFieldRef: {containerName: app, resource: limits.memory, divisor: 1Mi}}
      """
    When the simulation runs
    Then pod "web" is Running
    And pod "web" reads "app="web"\ntier="front"" at "/info:labels"
    And pod "web" reads "web" at "/info:app"
    And pod "web" reads "note="say \"hi\""" at "/info:notes/all"
    And pod "web" reads "web" at "/info:name"
    And pod "web" reads "250" at "/info:cpu"
    And pod "web" reads "128" at "/info:memory"
    And the file "/info:..data/labels" of pod "web" has mode 440
    And the file "/info:..data/notes/all" of pod "web" has mode 400
    And "/info" of pod "web" is on a tmpfs
    And container "app" of pod "web" mounts "/info" read-only
    When the label "tier=back" is set on pod "web"
    Then pod "web" comes to read "app="web"\ntier="back"" at "/info:labels"
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A projected volume joins a Secret, a ConfigMap, the downward API and a token for an audience
    Given the manifests:
      """
      apiVersion: v1
      kind: Secret
      metadata: {name: creds}
      stringData: {user: admin}
      ---
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: settings}
      data: {level: info}
      ---
      apiVersion: v1
      kind: ServiceAccount
      metadata: {name: robot}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        serviceAccountName: robot
        automountServiceAccountToken: false
        securityContext: {fsGroup: 4242}
        containers:
        - name: app
          image: busybox
          volumeMounts: [{name: all, mountPath: /all}]
        volumes:
        - name: all
          projected:
            sources:
            - secret: {name: creds}
            - configMap: {name: settings, items: [{key: level, path: conf/level}]}
            - downwardAPI: {items: [{path: pod, fieldRef: {fieldPath: metadata.name}}]}
            - serviceAccountToken: {audience: vault, expirationSeconds: 3600, path: vault-token}
      """
    When the simulation runs
    Then pod "web" is Running
    And pod "web" reads "admin" at "/all:user"
    And pod "web" reads "info" at "/all:conf/level"
    And pod "web" reads "web" at "/all:pod"
    And the token at "/all:vault-token" of pod "web" authenticates as "system:serviceaccount:default:robot" for audience "vault", bound to the pod and its node
    And the token at "/all:vault-token" of pod "web" is noted
    And the noted token is refused for audience "https://kubernetes.default.svc.cluster.local"
    And the file "/all:..data/vault-token" of pod "web" has mode 640
    And the file "/all:..data/vault-token" of pod "web" has group 4242
    And no report, log or call carries a secret value
    When all pods are deleted
    Then nothing is left on the node

  Scenario: Projected sources that cannot be read fail the mount together, with upstream's texts
    Given the manifests:
      """
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: settings}
      data: {level: info}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: broken, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        automountServiceAccountToken: false
        containers: [{name: app, image: busybox, volumeMounts: [{name: all, mountPath: /all}]}]
        volumes:
        - name: all
          projected:
            sources:
            - configMap: {name: missing}
            - configMap: {name: settings, items: [{key: nope, path: x}]}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: climbing, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        automountServiceAccountToken: false
        containers: [{name: app, image: busybox, volumeMounts: [{name: all, mountPath: /all}]}]
        volumes:
        - name: all
          projected:
            sources:
            - configMap: {name: settings, items: [{key: level, path: ../escape}]}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: lenient}
      spec:
        automountServiceAccountToken: false
        containers: [{name: app, image: busybox, volumeMounts: [{name: all, mountPath: /all}]}]
        volumes:
        - name: all
          projected:
            sources:
            - configMap: {name: missing, optional: true}
            - configMap: {name: settings}
      """
    When the simulation runs
    Then pod "broken" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "all" : [configmap "missing" not found, configmap references non-existent config key: nope]"
    And pod "climbing" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "all" : invalid path: must not contain '..': ../escape"
    And pod "lenient" is Running
    And pod "lenient" reads "info" at "/all:level"
    When all pods are deleted
    Then nothing is left on the node

  Scenario: The token is rotated at 80% of its life, by the clock, and a failed refresh keeps a valid token
    Given the manifests:
      """
      apiVersion: v1
      kind: ServiceAccount
      metadata: {name: robot}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        serviceAccountName: robot
        automountServiceAccountToken: false
        containers: [{name: app, image: busybox, volumeMounts: [{name: token, mountPath: /token}]}]
        volumes:
        - name: token
          projected:
            sources: [{serviceAccountToken: {path: token, expirationSeconds: 3600}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And the token at "/token:token" of pod "web" is noted
    When the clock moves on 47 minutes
    Then the token at "/token:token" of pod "web" stays the noted one
    When the clock moves on 2 minutes
    Then the token at "/token:token" of pod "web" comes to change
    And the token at "/token:token" of pod "web" authenticates as "system:serviceaccount:default:robot" for audience "https://kubernetes.default.svc.cluster.local", bound to the pod and its node
    And the token at "/token:token" of pod "web" is noted
    When the service account "default/robot" is deleted
    And the clock moves on 49 minutes
    Then the token at "/token:token" of pod "web" stays the noted one
    When the clock moves on 12 minutes
    Then pod "web" has a Warning "FailedMount" event starting "MountVolume.SetUp failed for volume "token" : token "robot"/"default"/[]string(nil)/3600/v1.BoundObjectReference{Kind:"Pod", APIVersion:"v1", Name:"web", UID:"
    And pod "web" has a Warning "FailedMount" event ending "expired and refresh failed: serviceaccounts "robot" not found"
    When all pods are deleted
    Then nothing is left on the node

  Scenario: The API refuses projected and downwardAPI sources a volume may not have, with its texts
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: short, annotations: {inlet.dev/expected-phase: Rejected}}
      spec:
        containers: [{name: app, image: busybox}]
        volumes:
        - name: token
          projected:
            sources: [{serviceAccountToken: {path: token, expirationSeconds: 60}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: nodename, annotations: {inlet.dev/expected-phase: Rejected}}
      spec:
        containers: [{name: app, image: busybox}]
        volumes:
        - name: info
          downwardAPI:
            items: [{path: node, fieldRef: {fieldPath: spec.nodeName}}, {path: cpu, resourceFieldRef: {resource: limits.cpu}}]
      """
    When the simulation runs
    Then pod "short" was rejected with "Pod "short" is invalid: spec.volumes[0].projected.sources[0].serviceAccountToken.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes"
    And pod "nodename" was rejected with "Pod "nodename" is invalid: [spec.volumes[0].downwardAPI.items[0].fieldRef.fieldPath: Unsupported value: "spec.nodeName": supported values: "metadata.annotations", "metadata.labels", "metadata.name", "metadata.namespace", "metadata.uid", spec.volumes[0].downwardAPI.items[1].resourceFieldRef.containerName: Required value]"
