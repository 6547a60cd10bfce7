Feature: fsGroup on inline volumes
  The CSIDriver's fsGroupPolicy decides whether the kubelet gives a volume to the pod's fsGroup:
  File always, ReadWriteOnceWithFSType only when the volume has an fsType, None never, and never for a
  read-only volume (csi_mounter.go supportsFSGroup).

  Scenario Outline: fsGroupPolicy <policy> with fsType "<fs_type>" and readOnly <read_only>
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      fsGroupPolicy: <policy>
      """
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        securityContext: {fsGroup: 4242}
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, fsType: "<fs_type>", readOnly: <read_only>}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And the mount dir of "data" in pod "web" <applied> group 4242

    Examples:
      | policy                  | fs_type | read_only | applied       |
      | File                    |         | false     | has           |
      | File                    |         | true      | does not have |
      | ReadWriteOnceWithFSType |         | false     | does not have |
      | ReadWriteOnceWithFSType | ext4    | false     | has           |
      | None                    | ext4    | false     | does not have |
