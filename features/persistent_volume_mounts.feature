Feature: How the kubelet mounts a PV: read-only, access modes, fsGroup, ReadWriteOncePod, the staging record
  A PV's CSI calls take their flags from the volume spec the kubelet built, exactly as upstream's
  pkg/volume/csi does: readOnly from the claim in the pod (never spec.csi.readOnly, kubernetes#69843), one
  access-mode mapper for NodeStageVolume and NodePublishVolume chosen by the driver's
  SINGLE_NODE_MULTI_WRITER capability (csi_client.go), fsGroup for ReadWriteOnce PVs only and through the
  driver when it has VOLUME_MOUNT_GROUP, ReadWriteOncePod enforced on the node before any CSI call
  (operation_generator.go), and a staging record with just the handle and the driver (csi_attacher.go).

  Background:
    Given a CSIDriver "local.inlet.dev" with:
      """
      attachRequired: false
      volumeLifecycleModes: [Persistent]
      """

  Scenario: NodePublishVolume's readonly is the claim's, never spec.csi.readOnly
    Given the local driver "local.inlet.dev"
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-csi-ro}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: pv-csi-ro, readOnly: true}
        claimRef: {namespace: default, name: csi-ro}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: csi-ro}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
      ---
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-claim-ro}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: pv-claim-ro}
        claimRef: {namespace: default, name: claim-ro}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: claim-ro}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers:
        - name: app
          image: busybox
          volumeMounts: [{name: a, mountPath: /a}, {name: b, mountPath: /b}]
        volumes:
        - {name: a, persistentVolumeClaim: {claimName: csi-ro}}
        - {name: b, persistentVolumeClaim: {claimName: claim-ro, readOnly: true}}
      """
    When the simulation runs
    Then pod "web" is Running
    And the publish of "pv-csi-ro" in pod "web" is read-write
    And container "app" of pod "web" mounts "/a" read-write
    And the publish of "pv-claim-ro" in pod "web" is read-only
    And container "app" of pod "web" mounts "/b" read-only

  Scenario Outline: A <mode> PV is staged and published with <csi_mode>
    Given the local driver "local.inlet.dev"
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-data}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [<mode>]
        csi: {driver: local.inlet.dev, volumeHandle: pv-data}
        claimRef: {namespace: default, name: data}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: data}
      spec: {accessModes: [<mode>], resources: {requests: {storage: 16Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And every NodeStageVolume call for handle "pv-data" has access mode "<csi_mode>"
    And every NodePublishVolume call for handle "pv-data" has access mode "<csi_mode>"

    Examples:
      | mode             | csi_mode                  |
      | ReadWriteOnce    | SINGLE_NODE_MULTI_WRITER  |
      | ReadWriteOncePod | SINGLE_NODE_SINGLE_WRITER |

  Scenario: A driver with VOLUME_MOUNT_GROUP gets the pod's fsGroup at NodeStageVolume and NodePublishVolume
    Given the local driver "local.inlet.dev" with mount group
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-data}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: pv-data}
        claimRef: {namespace: default, name: data}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: data}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        securityContext: {fsGroup: 4242}
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And every NodeStageVolume call for handle "pv-data" has volume mount group "4242"
    And every NodePublishVolume call for handle "pv-data" has volume mount group "4242"
    And the mount dir of "pv-data" in pod "web" has group 4242

  Scenario: fsGroup is applied to a PV only when its access modes include ReadWriteOnce
    Given the local driver "local.inlet.dev"
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-rwop}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOncePod]
        csi: {driver: local.inlet.dev, volumeHandle: pv-rwop, fsType: ext4}
        claimRef: {namespace: default, name: rwop}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: rwop}
      spec: {accessModes: [ReadWriteOncePod], resources: {requests: {storage: 16Mi}}}
      ---
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-rwo}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: pv-rwo, fsType: ext4}
        claimRef: {namespace: default, name: rwo}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: rwo}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        securityContext: {fsGroup: 4242}
        containers:
        - name: app
          image: busybox
          volumeMounts: [{name: a, mountPath: /a}, {name: b, mountPath: /b}]
        volumes:
        - {name: a, persistentVolumeClaim: {claimName: rwop}}
        - {name: b, persistentVolumeClaim: {claimName: rwo}}
      """
    When the simulation runs
    Then pod "web" is Running
    And the mount dir of "pv-rwop" in pod "web" does not have group 4242
    And the mount dir of "pv-rwo" in pod "web" has group 4242

  Scenario: A second pod of a ReadWriteOncePod volume waits on the node, and the driver never sees it
    Given the local driver "local.inlet.dev"
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-rwop}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOncePod]
        csi: {driver: local.inlet.dev, volumeHandle: pv-rwop}
        claimRef: {namespace: default, name: rwop}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: rwop}
      spec: {accessModes: [ReadWriteOncePod], resources: {requests: {storage: 16Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: first}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: rwop}}]
      """
    When the simulation runs
    And these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: second}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: rwop}}]
      """
    Then pod "second" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "pv-rwop" : volume uses the ReadWriteOncePod access mode and is already in use by another pod"
    And pod "second" is Pending
    And the driver got no NodePublishVolume for volume "pv-rwop" of pod "second"
    When pod "first" is deleted
    Then pod "second" becomes Running

  Scenario: Two new pods of one ReadWriteOncePod volume in the same pass: one mounts, the other waits
    The kubelet runs one mount of a device-mountable volume at a time for all its pods
    (`operation_executor.go` MountVolume), so the second pod's ReadWriteOncePod check sees the first one's
    mount, and the driver is asked once.
    Given the local driver "local.inlet.dev"
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-race}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOncePod]
        csi: {driver: local.inlet.dev, volumeHandle: pv-race}
        claimRef: {namespace: default, name: race}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: race}
      spec: {accessModes: [ReadWriteOncePod], resources: {requests: {storage: 16Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: one}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: race}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: other}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: race}}]
      """
    When the simulation runs
    Then one of pods "one" and "other" is Running and the other has a Warning "FailedMount" event saying "volume uses the ReadWriteOncePod access mode and is already in use by another pod"
    And the driver got NodePublishVolume for handle "pv-race" 1 time
    And no NodePublishVolume for handle "pv-race" failed

  Scenario: MountDevice keeps just the handle and the driver beside the staging dir
    Given the local driver "local.inlet.dev"
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-data}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: pv-data}
        claimRef: {namespace: default, name: data}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: data}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And the staging record of handle "pv-data" on "node-1" is exactly {"driverName":"local.inlet.dev","volumeHandle":"pv-data"}
    When all pods are deleted
    Then nothing is left on the node
