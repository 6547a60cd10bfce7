Feature: Expanding a volume in use
  A claim of a class with allowVolumeExpansion whose request grows is expanded by the external-resizer
  (ControllerExpandVolume; kubelet-sim runs it) and its PV's capacity grows; the claim waits with the
  FileSystemResizePending condition while the node must finish. The kubelet sees the PV's capacity
  beyond the claim's status capacity (volumeRequiresFSResize), calls NodeExpandVolume at the pod's mount
  path (GenerateExpandInUseVolumeFunc, csi_expander.go), sets the claim's status capacity and removes the
  condition, and tells the pod: FileSystemResizeSuccessful. The pod keeps running.

  Scenario: A claim grown while its pod runs is expanded in the controller; a directory needs no node step
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Persistent]
      attachRequired: false
      """
    And the manifests:
      """
      apiVersion: storage.k8s.io/v1
      kind: StorageClass
      metadata: {name: expandable}
      provisioner: local.inlet.dev
      volumeBindingMode: WaitForFirstConsumer
      allowVolumeExpansion: true
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: data}
      spec:
        storageClassName: expandable
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 16Mi}}
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
    When the claim "default/data" is resized to "32Mi"
    Then the claim "default/data" has capacity "32Mi" and no FileSystemResizePending condition
    And the driver got ControllerExpandVolume calls
    And the driver got no NodeExpandVolume calls
    And pod "web" is Running
