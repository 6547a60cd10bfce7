@registry
Feature: Private volume images
  Credentials come from the pod's imagePullSecrets (in-tree) or the volume's nodePublishSecretRef (CSI),
  and reach the registry through the runtime's PullImage. A node that holds a private image hands it only
  to pods that prove access to it (KEP-2535), and says in an event why a pod was refused. These scenarios
  run a real docker-registry behind basic auth.

  Background:
    Given a private registry with user "alice" and password "s3cret"
    And the registry holds image "$REGISTRY/team/data:v1" with files:
      | path       | content       |
      | secret.txt | private bytes |
    And a pull secret "default/regcred" for the registry with user "alice" and password "s3cret"

  Scenario: A pod with the pull secret mounts the private image; one without it is refused
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: allowed}
      spec:
        imagePullSecrets: [{name: regcred}]
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, image: {reference: "$REGISTRY/team/data:v1"}}]
      """
    When the simulation runs
    Then pod "allowed" is Running
    And pod "allowed" reads "private bytes" at "/data:secret.txt"
    When these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: intruder}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, image: {reference: "$REGISTRY/team/data:v1", pullPolicy: IfNotPresent}}]
      """
    Then pod "intruder" has a Warning "FailedMount" event saying "was pulled with credentials this volume does not have"
    And pod "intruder" is Pending
    And no report, log or call carries a secret value

  Scenario: A pulled-image record that cannot be read makes its image need proof, and is left as it is
    Records are kept as the kubelet keeps them (`<root>/image_manager/pulled/sha256-<image id hash>`), and
    one that cannot be read stops nothing: its image needs proof (fs_pullrecords.go forces the pull); it is
    not overwritten, since a kubelet's names for the image may be in it.
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: allowed}
      spec:
        imagePullSecrets: [{name: regcred}]
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, image: {reference: "$REGISTRY/team/data:v1"}}]
      """
    When the simulation runs
    Then pod "allowed" is Running
    When the pulled-image records of node "node-1" are overwritten with garbage
    And these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: intruder}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, image: {reference: "$REGISTRY/team/data:v1", pullPolicy: IfNotPresent}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: allowed-again}
      spec:
        imagePullSecrets: [{name: regcred}]
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, image: {reference: "$REGISTRY/team/data:v1", pullPolicy: IfNotPresent}}]
      """
    Then pod "intruder" has a Warning "FailedMount" event saying "was pulled with credentials this volume does not have"
    And pod "allowed-again" is Running
    And the pulled-image records of node "node-1" are left as they were

  Scenario: Wrong credentials are refused by the registry
    Given a pull secret "default/wrong" for the registry with user "alice" and password "guess"
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        imagePullSecrets: [{name: wrong}]
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, image: {reference: "$REGISTRY/team/data:v1"}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "FailedMount" event saying "unauthorized"
    And pod "web" is Pending

  Scenario: An unknown image in the registry is a clear event
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        imagePullSecrets: [{name: regcred}]
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, image: {reference: "$REGISTRY/team/absent:v1"}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "FailedMount" event saying "not found"
    And pod "web" is Pending

  Scenario: The CSI driver takes credentials from the volume's nodePublishSecretRef
    Given the image driver "image.inlet.dev"
    And a CSIDriver "image.inlet.dev" with:
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
              driver: image.inlet.dev
              readOnly: true
              volumeAttributes: {image: "$REGISTRY/team/data:v1"}
              nodePublishSecretRef: {name: regcred}
      """
    When the simulation runs
    Then pod "web" is Running
    And the publish of "data" in pod "web" has secret keys ".dockerconfigjson"
    And pod "web" reads "private bytes" at "/data:secret.txt"
    And no report, log or call carries a secret value

  Scenario: Container images are pulled with the same pull secrets
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: with-secret}
      spec:
        imagePullSecrets: [{name: regcred}]
        containers: [{name: app, image: "$REGISTRY/team/data:v1"}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: without}
      spec:
        containers: [{name: app, image: "$REGISTRY/team/data:v1", imagePullPolicy: Always}]
      """
    When the simulation runs
    Then pod "with-secret" is Running
    And pod "without" has a Warning "Failed" event saying "401 Unauthorized"
    And pod "without" is Pending

  # One record per node of which credentials pulled which image, whichever path pulled it: the kubelet's
  # container images and in-tree image volumes, and the CSI image driver. With a record each, an image one
  # pulled with credentials looked preloaded to the other, which handed it to pods without them.
  Scenario: An image the in-tree plugin pulled with credentials is refused to a CSI volume without them
    Given the image driver "image.inlet.dev"
    And a CSIDriver "image.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      podInfoOnMount: true
      """
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: owner}
      spec:
        imagePullSecrets: [{name: regcred}]
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, image: {reference: "$REGISTRY/team/data:v1"}}]
      """
    When the simulation runs
    Then pod "owner" is Running
    When these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: intruder}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes:
          - name: data
            csi: {driver: image.inlet.dev, readOnly: true, volumeAttributes: {image: "$REGISTRY/team/data:v1", pullPolicy: IfNotPresent}}
      """
    Then pod "intruder" has a Warning "FailedMount" event saying "was pulled with credentials this volume does not have"
    And pod "intruder" is Pending

  Scenario: An image the CSI driver pulled with credentials is refused to an in-tree volume without them
    Given the image driver "image.inlet.dev"
    And a CSIDriver "image.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      podInfoOnMount: true
      """
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: owner}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes:
          - name: data
            csi: {driver: image.inlet.dev, readOnly: true, volumeAttributes: {image: "$REGISTRY/team/data:v1"}, nodePublishSecretRef: {name: regcred}}
      """
    When the simulation runs
    Then pod "owner" is Running
    When these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: intruder}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, image: {reference: "$REGISTRY/team/data:v1", pullPolicy: IfNotPresent}}]
      """
    Then pod "intruder" has a Warning "FailedMount" event saying "was pulled with credentials this volume does not have"
    And pod "intruder" is Pending

  Scenario Outline: A cached container image pulled with credentials, under <policy> (allowlist "<allowlist>")
    Given the image pull credentials verification policy is <policy>
    And the preloaded images verification allowlist is "<allowlist>"
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: owner}
      spec:
        imagePullSecrets: [{name: regcred}]
        containers: [{name: app, image: "$REGISTRY/team/data:v1"}]
      """
    When the simulation runs
    Then pod "owner" is Running
    When these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: other}
      spec:
        containers: [{name: app, image: "$REGISTRY/team/data:v1", imagePullPolicy: IfNotPresent}]
      """
    Then pod "other" <outcome>

    Examples:
      | policy                       | allowlist               | outcome                                                |
      | NeverVerifyPreloadedImages   |                         | has a Warning "Failed" event saying "401 Unauthorized" |
      | AlwaysVerify                 |                         | has a Warning "Failed" event saying "401 Unauthorized" |
      | NeverVerify                  |                         | is Running                                             |
      | NeverVerifyAllowlistedImages | $REGISTRY/team/data     | is Running                                             |
      | NeverVerifyAllowlistedImages | $REGISTRY/team/*        | is Running                                             |
      | NeverVerifyAllowlistedImages | $REGISTRY/other/*       | has a Warning "Failed" event saying "401 Unauthorized" |

  Scenario: A cached private container image with pull policy Never is not present for a pod without its credentials
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: owner}
      spec:
        imagePullSecrets: [{name: regcred}]
        containers: [{name: app, image: "$REGISTRY/team/data:v1"}]
      """
    When the simulation runs
    Then pod "owner" is Running
    When these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: other}
      spec:
        containers: [{name: app, image: "$REGISTRY/team/data:v1", imagePullPolicy: Never}]
      """
    Then pod "other" has a Warning "ErrImageNeverPull" event saying "is not present with pull policy of Never"
    And pod "other" is Pending
