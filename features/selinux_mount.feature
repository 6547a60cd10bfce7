Feature: SELinux mount contexts (KEP-1710)
  On a node that runs SELinux the kubelet mounts a volume with the pod's label (`-o context="..."`) instead
  of letting the runtime relabel every file, when the volume's CSIDriver says `seLinuxMount: true`. In 1.35
  that is only ever a PersistentVolume's volume, and by default only a ReadWriteOncePod one
  (`VolumeSupportsSELinuxMount`); a CSI inline volume never gets a context, whatever its CSIDriver says.
  The context goes to NodeStageVolume and NodePublishVolume alike, and a driver that cannot mount with it
  fails the mount in its own words. Upstream: pkg/volume/util/selinux.go, desired_state_of_world.go,
  csi_mounter.go, csi_attacher.go; e2e csimock/csi_selinux_mount.go.

  Background:
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      attachRequired: false
      seLinuxMount: true
      volumeLifecycleModes: [Persistent, Ephemeral]
      """

  Scenario Outline: A PV takes the pod's label only where its access modes and the gates allow
    Given the node runs SELinux
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-labelled}
      spec:
        capacity: {storage: 64Mi}
        accessModes: [<mode>]
        csi: {driver: local.inlet.dev, volumeHandle: pv-labelled}
        claimRef: {namespace: default, name: data}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: data}
      spec: {accessModes: [<mode>], resources: {requests: {storage: 64Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: labelled, annotations: {inlet.dev/expected-phase: <phase>}}
      spec:
        securityContext:
          seLinuxOptions: {user: system_u, role: system_r, type: container_t, level: "s0:c0,c1"}
          seLinuxChangePolicy: <policy>
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
      """
    When the simulation runs
    Then the NodeStageVolume call for handle "pv-labelled" <stage>
    And pod "labelled" is <phase>

    Examples:
      | mode             | policy      | stage                                                                                   | phase   |
      | ReadWriteOncePod | MountOption | has the mount flag context="system_u:object_r:container_file_t:s0:c0,c1"                | Pending |
      | ReadWriteOncePod | Recursive   | has no context mount flag                                                               | Running |
      | ReadWriteOnce    | MountOption | has no context mount flag                                                               | Running |

  Scenario: A driver that cannot mount with the context fails the mount in its own words
    Given the node runs SELinux
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-rwop}
      spec:
        capacity: {storage: 64Mi}
        accessModes: [ReadWriteOncePod]
        csi: {driver: local.inlet.dev, volumeHandle: pv-rwop}
        claimRef: {namespace: default, name: data}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: data}
      spec: {accessModes: [ReadWriteOncePod], resources: {requests: {storage: 64Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: labelled, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        securityContext:
          seLinuxOptions: {user: system_u, role: system_r, type: container_t, level: "s0:c0,c1"}
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
      """
    When the simulation runs
    Then pod "labelled" has a Warning "FailedMount" event saying "MountVolume.MountDevice failed for volume "pv-rwop" : rpc error: code = InvalidArgument desc = volume_capability.mount.mount_flags: unsupported flag "context=\"system_u:object_r:container_file_t:s0:c0,c1\"""
    And the driver got no NodePublishVolume calls

  Scenario: The SELinuxMount gate gives every PV's volume the label, whatever its access modes
    Given the node runs SELinux
    And the feature gate "SELinuxMount" is on
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-rwo}
      spec:
        capacity: {storage: 64Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: pv-rwo}
        claimRef: {namespace: default, name: data}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: data}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: labelled, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        securityContext:
          seLinuxOptions: {user: system_u, role: system_r, type: container_t, level: "s0:c98,c99"}
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
      """
    When the simulation runs
    Then the NodeStageVolume call for handle "pv-rwo" has the mount flag context="system_u:object_r:container_file_t:s0:c98,c99"

  Scenario: A CSI inline volume never gets a context, even from a driver that supports one
    Given the node runs SELinux
    And the feature gate "SELinuxMount" is on
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: inline}
      spec:
        securityContext:
          seLinuxOptions: {user: system_u, role: system_r, type: container_t, level: "s0:c0,c1"}
        containers: [{name: app, image: busybox, volumeMounts: [{name: scratch, mountPath: /scratch}]}]
        volumes: [{name: scratch, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "inline" is Running
    And the publish of "scratch" in pod "inline" has no context mount flag

  Scenario: A node without SELinux never mounts with a context
    Given the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-rwop}
      spec:
        capacity: {storage: 64Mi}
        accessModes: [ReadWriteOncePod]
        csi: {driver: local.inlet.dev, volumeHandle: pv-rwop}
        claimRef: {namespace: default, name: data}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: data}
      spec: {accessModes: [ReadWriteOncePod], resources: {requests: {storage: 64Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: labelled}
      spec:
        securityContext:
          seLinuxOptions: {user: system_u, role: system_r, type: container_t, level: "s0:c0,c1"}
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
      """
    When the simulation runs
    Then pod "labelled" is Running
    And the NodeStageVolume call for handle "pv-rwop" has no context mount flag

  Scenario: Two containers with different labels on a volume that takes one keep the pod from starting
    Given the node runs SELinux
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-rwop}
      spec:
        capacity: {storage: 64Mi}
        accessModes: [ReadWriteOncePod]
        csi: {driver: local.inlet.dev, volumeHandle: pv-rwop}
        claimRef: {namespace: default, name: data}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: data}
      spec: {accessModes: [ReadWriteOncePod], resources: {requests: {storage: 64Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: two-labels, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers:
        - name: a
          image: busybox
          securityContext: {seLinuxOptions: {level: "s0:c0,c1"}}
          volumeMounts: [{name: data, mountPath: /data}]
        - name: b
          image: busybox
          securityContext: {seLinuxOptions: {level: "s0:c2,c3"}}
          volumeMounts: [{name: data, mountPath: /data}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
      """
    When the simulation runs
    Then pod "two-labels" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "data" : multiple SELinux labels found: system_u:object_r:container_file_t:s0:c0,c1,system_u:object_r:container_file_t:s0:c2,c3"
    And the driver got no NodeStageVolume calls
