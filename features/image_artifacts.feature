@registry
Feature: OCI artifacts as volumes, on an explicit opt-in
  Runtimes pull container images only. Content pushed as an OCI artifact (a model, a data set) is fetched by
  the image driver itself when the volume says `artifact: "true"`, with the volume's credentials: the one
  path where the runtime's registry configuration does not apply. Files are named by their layers' titles,
  stored by digest, and mounted read-only.

  Background:
    Given a private registry with user "alice" and password "s3cret"
    And the registry holds artifact "$REGISTRY/models/tiny:v1" with files:
      | path          | content      |
      | model.bin     | weights      |
      | tokenizer.txt | a b c        |
    And a pull secret "default/regcred" for the registry with user "alice" and password "s3cret"
    And the image driver "image.inlet.dev"
    And a CSIDriver "image.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      podInfoOnMount: true
      """

  Scenario: An artifact volume presents the artifact's files read-only, shared by every pod
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: a}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: model, mountPath: /model}]}]
        volumes:
          - name: model
            csi:
              driver: image.inlet.dev
              readOnly: true
              volumeAttributes: {image: "$REGISTRY/models/tiny:v1", artifact: "true"}
              nodePublishSecretRef: {name: regcred}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: b}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: model, mountPath: /model}]}]
        volumes:
          - name: model
            csi:
              driver: image.inlet.dev
              readOnly: true
              volumeAttributes: {image: "$REGISTRY/models/tiny:v1", artifact: "true"}
              nodePublishSecretRef: {name: regcred}
      """
    When the simulation runs
    Then pod "a" is Running
    And pod "b" is Running
    And pod "a" reads "weights" at "/model:model.bin"
    And pod "b" reads "a b c" at "/model:tokenizer.txt"
    And pod "a" cannot write to "/model:model.bin"
    And node "node-1" holds 1 shared read-only image mount
    And the runtime got PullImage for "$REGISTRY/models/tiny:v1" 0 times
    When all pods are deleted
    Then nothing is left on the node

  Scenario: Without the opt-in the runtime is asked, and cannot run an artifact
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: model, mountPath: /model}]}]
        volumes:
          - name: model
            csi:
              driver: image.inlet.dev
              readOnly: true
              volumeAttributes: {image: "$REGISTRY/models/tiny:v1"}
              nodePublishSecretRef: {name: regcred}
      """
    When the simulation runs
    Then pod "web" has a Warning "FailedMount" event saying "OCI artifacts cannot be run"
    And pod "web" is Pending

  Scenario: An artifact volume must be read-only, and needs credentials the registry accepts
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: writable}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: model, mountPath: /model}]}]
        volumes:
          - name: model
            csi:
              driver: image.inlet.dev
              volumeAttributes: {image: "$REGISTRY/models/tiny:v1", artifact: "true"}
              nodePublishSecretRef: {name: regcred}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: anonymous}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: model, mountPath: /model}]}]
        volumes:
          - name: model
            csi:
              driver: image.inlet.dev
              readOnly: true
              volumeAttributes: {image: "$REGISTRY/models/tiny:v1", artifact: "true"}
      """
    When the simulation runs
    Then pod "writable" has a Warning "FailedMount" event saying "OCI artifact volumes are read-only"
    And pod "anonymous" has a Warning "FailedMount" event saying "the registry refused the credentials"
