Feature: Pulling volume images: policies, slow pulls and errors
  Volume images are pulled through CRI PullImage with the container pull policies. A pull that outlasts
  one mount attempt goes on in the background; the attempt fails with the pull's progress, and a later
  attempt mounts the volume. Bad input is a clear pod event, never a crash.

  Background:
    Given an image "example.inlet.dev/site:v1" with files:
      | path       | content |
      | index.html | hello   |

  Scenario: IfNotPresent pulls once; Always pulls for every volume
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: a}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1, pullPolicy: IfNotPresent}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: b}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1, pullPolicy: IfNotPresent}}]
      """
    When the simulation runs
    Then pod "a" is Running
    And pod "b" is Running
    And the runtime got PullImage for "example.inlet.dev/site:v1" 0 times
    When these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: c}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1, pullPolicy: Always}}]
      """
    Then pod "c" becomes Running
    And the runtime got PullImage for "example.inlet.dev/site:v1" 1 time
    And pod "c" has a Normal "Pulled" event saying "Successfully pulled image"

  Scenario: Never with an absent image is refused with the kubelet's words
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/absent:v1, pullPolicy: Never}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "FailedMount" event saying "example.inlet.dev/absent:v1" is not present with pull policy of Never"
    And pod "web" is Pending

  Scenario: A pull longer than a mount attempt goes on, and a later attempt mounts the volume
    Given one mount attempt waits at most 100ms for a pull
    And the runtime takes 1500ms to pull an image
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1, pullPolicy: Always}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "FailedMount" event saying "in the background (0s elapsed"
    And pod "web" has a Normal "Pulling" event saying "example.inlet.dev/site:v1"
    And pod "web" becomes Running
    And the runtime got PullImage for "example.inlet.dev/site:v1" 1 time

  Scenario: An inline CSI image volume past the driver's deadline is retried until its pull is done
    Given one mount attempt waits at most 100ms for a pull
    And the runtime takes 1500ms to pull an image
    And the image driver "image.inlet.dev"
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
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, csi: {driver: image.inlet.dev, volumeAttributes: {image: example.inlet.dev/site:v1, pullAlways: "true"}}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "FailedMount" event saying "in the background"
    And pod "web" becomes Running
    And the runtime got PullImage for "example.inlet.dev/site:v1" 1 time

  Scenario: A bad reference and an image without layers are clear events
    Given an image "example.inlet.dev/scratch:v1" with no layers
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: bad}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: "Not A Reference"}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: empty}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/scratch:v1}}]
      """
    When the simulation runs
    Then pod "bad" has a Warning "FailedMount" event saying "is not an image reference"
    And pod "empty" has a Warning "FailedMount" event saying "has no layers (built FROM scratch with nothing added)"
    And pod "bad" is Pending
    And pod "empty" is Pending
    When all pods are deleted
    Then nothing is left on the node

  Scenario: An unreachable runtime is a clear, retried event
    Given the runtime fails ImageStatus with UNAVAILABLE
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "FailedMount" event saying "container runtime is unavailable: connection refused"
    And pod "web" is Pending

  Scenario: An image volume without a reference, or with an unknown pull policy, is refused at admission
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: no-reference}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {pullPolicy: Always}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: bad-policy}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1, pullPolicy: Sometimes}}]
      """
    When the simulation runs
    Then pod "no-reference" was rejected with "spec.volumes[0].image.reference: Required value"
    And pod "bad-policy" was rejected with "spec.volumes[0].image.pullPolicy: Unsupported value"
