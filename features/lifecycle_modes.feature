Feature: Lifecycle modes and driver registration
  The kubelet checks that the driver is registered, then that its CSIDriver object allows the volume's
  lifecycle mode, before it calls the driver (csi_mounter.go SetUpAt). Both failures are transient: the pod
  waits with FailedMount events and starts once the cause is gone.

  Scenario: An inline volume of a driver with no CSIDriver object is refused
    Given the local driver "local.inlet.dev"
    And no CSIDriver object for "local.inlet.dev"
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
    Then pod "web" is Pending
    And pod "web" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "data" : kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: volume mode "Ephemeral" not supported by driver local.inlet.dev (no CSIDriver object)"
    And the driver got no NodePublishVolume call

  Scenario: An inline volume of a driver that only lists Persistent is refused
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Persistent]
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
    Then pod "web" has a Warning "FailedMount" event saying "volume mode "Ephemeral" not supported by driver local.inlet.dev (only supports ["Persistent"])"

  Scenario: An empty volumeLifecycleModes means Persistent only
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: []
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
    Then pod "web" has a Warning "FailedMount" event saying "(only supports ["Persistent"])"

  Scenario: Registration is checked before the lifecycle mode
    Given no CSIDriver object for "ghost.example.com"
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: ghost.example.com}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "FailedMount" event saying "kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name ghost.example.com not found in the list of registered CSI drivers"

  Scenario: A pod waits for an unregistered driver and starts once it registers
    Given a CSIDriver "late.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      """
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: late.inlet.dev}}]
      """
    When the simulation runs
    Then pod "web" is Pending
    And pod "web" has a Warning "FailedMount" event saying "driver name late.inlet.dev not found in the list of registered CSI drivers"
    When the local driver "late.inlet.dev" registers
    Then pod "web" becomes Running
