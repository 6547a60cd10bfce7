Feature: Kubelet restarts and several nodes
  The kubelet records each volume in vol_data.json beside its mount dir. After a restart it reconstructs
  its volumes from them: volumes of pods that still exist are published again (idempotently), and volumes of
  pods deleted while it was down are torn down, with nothing left behind.

  Background:
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      """

  Scenario: Volumes are reconstructed after a restart, and those of pods deleted meanwhile are torn down
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: keep}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: gone}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    And the kubelet of "node-1" stops
    And pod "gone" is force-deleted
    And the kubelet of "node-1" starts again
    Then the driver got NodeUnpublishVolume for volume "data" of pod "gone"
    And nothing is left of pod "gone" on "node-1"
    And pod "keep" is Running
    And the driver published "data" of pod "keep" at least 2 times
    When all pods are deleted
    Then nothing is left on the node

  Scenario: Pods spread over several simulated nodes, each with its own driver
    Given 2 nodes
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: one}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: two}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "one" is Running
    And pod "two" is Running
    And pods "one" and "two" run on different nodes
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A restarted kubelet tears nothing down before its pods are loaded
    Upstream's reconciler unmounts nothing until the populator has added the pods of every source
    (reconstruct.go, readyToUnmount): a pod not yet seen is not a deleted pod.
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: keep, uid: 6b0c3c5e-0000-4000-8000-000000000001}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    And kubelet-sim restarts on the same root, its manifests applied 300 ms later
    Then pod "keep" is Running
    And the driver got no NodeUnpublishVolume for volume "data" of pod "keep"
    And the driver published "data" of pod "keep" at least 1 times
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A driver that goes away and comes back: the pod waits with an event, then runs, and nothing leaks
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: before}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "before" is Running
    When the local driver "local.inlet.dev" stops
    And these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: during}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    Then pod "during" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "data""
    And pod "during" is Pending
    When the local driver "local.inlet.dev" registers
    Then pod "during" is Running
    When all pods are deleted
    Then nothing is left on the node

  Scenario: The runtime goes away and comes back: the pod waits with an event, then runs, and nothing leaks
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: before}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "before" is Running
    When the runtime stops
    And these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: during}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    Then pod "during" has a Warning "FailedCreatePodSandBox" event saying "Failed to create pod sandbox: rpc error: code = Unavailable"
    And pod "during" is Pending
    When the runtime starts again
    Then pod "during" is Running
    And pod "before" is Running
    When all pods are deleted
    Then nothing is left on the node
