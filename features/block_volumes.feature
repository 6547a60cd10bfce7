Feature: Raw block persistent volumes
  A PV of `volumeMode: Block` reaches the pod as a device, not a filesystem (`pkg/volume/csi/csi_block.go`):
  NodeStageVolume with the Block access type at `plugins/kubernetes.io/csi/volumeDevices/staging/<pv>`
  (SetUpDevice), NodePublishVolume to a device file at `.../volumeDevices/publish/<pv>/<pod uid>`
  (MapPodDevice), the pod's `volumeDevices/kubernetes.io~csi/<pv>` symlink to it (MapBlockVolume), and a
  CRI device for each container's volumeDevice (makeBlockVolumes). A Block claim in volumeMounts, or a
  Filesystem one in volumeDevices, is refused with the populator's text.

  Background:
    Given the local driver "local.inlet.dev" with attach
    And a CSIDriver "local.inlet.dev" with:
      """
      attachRequired: true
      volumeLifecycleModes: [Persistent]
      """
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-blk}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        volumeMode: Block
        csi: {driver: local.inlet.dev, volumeHandle: pv-blk}
        claimRef: {namespace: default, name: blk}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: blk}
      spec: {accessModes: [ReadWriteOnce], volumeMode: Block, resources: {requests: {storage: 16Mi}}}
      """

  Scenario: A Block PV is staged and published as a device, and the container gets it
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: db}
      spec:
        containers:
        - name: app
          image: busybox
          command: [sleep, "3600"]
          volumeDevices: [{name: data, devicePath: /dev/xvda}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: blk}}]
      """
    When the simulation runs
    Then pod "db" is Running
    And the driver staged handle "pv-blk" as Block at "plugins/kubernetes.io/csi/volumeDevices/staging/pv-blk"
    And the driver published handle "pv-blk" as Block for pod "db" at "plugins/kubernetes.io/csi/volumeDevices/publish/pv-blk/{uid}"
    And container "app" of pod "db" has the device "/dev/xvda" from "pods/{uid}/volumeDevices/kubernetes.io~csi/pv-blk", a link to "plugins/kubernetes.io/csi/volumeDevices/publish/pv-blk/{uid}", with "mrw"
    When all pods are deleted
    Then the driver got NodeUnstageVolume for handle "pv-blk" 1 time
    And nothing is left on the node
    And the kubelet dir of "node-1" holds nothing of "pv-blk" under "plugins/kubernetes.io/csi/volumeDevices"

  Scenario: A Block claim in volumeMounts is refused with the populator's text
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: wrong, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: blk}}]
      """
    When the simulation runs
    Then pod "wrong" has a Warning "FailedMount" event saying "volume data has volumeMode Block, but is specified in volumeMounts"
    And the driver got no NodePublishVolume call
    When all pods are deleted
    Then nothing is left on the node
