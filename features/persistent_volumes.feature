Feature: Persistent volumes through PV and PVC
  A pre-bound PV goes through attach (a VolumeAttachment and ControllerPublishVolume when the driver
  requires it), NodeStageVolume at a global path shared by every pod on the node, and NodePublishVolume per
  pod; teardown runs in reverse, unstaging and detaching only after the last pod on the node is gone.

  Background:
    Given the local driver "local.inlet.dev" with attach
    And a CSIDriver "local.inlet.dev" with:
      """
      attachRequired: true
      volumeLifecycleModes: [Persistent, Ephemeral]
      """
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-data}
      spec:
        capacity: {storage: 64Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: pv-data}
        claimRef: {namespace: default, name: data}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: data}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: first}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: second}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
      """

  Scenario: A PV is attached, staged once on the node and published for each pod
    When the simulation runs
    Then pod "first" is Running
    And pod "second" is Running
    And a VolumeAttachment for handle "pv-data" of "local.inlet.dev" on "node-1" is attached
    And there is 1 VolumeAttachment
    And the driver got ControllerPublishVolume for handle "pv-data" 1 time
    And the driver got NodeStageVolume for handle "pv-data" 1 time
    And the driver got NodePublishVolume for volume "pv-data" of pod "first"
    And the driver got NodePublishVolume for volume "pv-data" of pod "second"
    And the publish of "pv-data" in pod "first" has the staging path set

  Scenario: Unstage and detach wait for the last pod on the node
    When the simulation runs
    Then pod "first" is Running
    And pod "second" is Running
    When pod "first" is deleted
    Then the driver got NodeUnpublishVolume for volume "pv-data" of pod "first"
    And the driver got no NodeUnstageVolume call
    And there is 1 VolumeAttachment
    When all pods are deleted
    Then the driver got NodeUnstageVolume for handle "pv-data" 1 time
    And the driver got ControllerUnpublishVolume for handle "pv-data" 1 time
    And no VolumeAttachment is left
    And nothing is left on the node
