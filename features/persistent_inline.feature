Feature: Persistent inline volumes (the KEP-596 draft, feature gate PersistentInlineCSI)
  Behind a gate that is off by default: an inline csi source with a volumeHandle, for a driver whose modes
  include Persistent, is attached, staged and published like a PV, if the PersistentVolume of that handle
  grants it to the pod's namespace (`inlet.dev/inline-namespaces`): a handle is not a secret, so without a
  grant any namespace could reach any pre-provisioned volume. Admission refuses a pod the grant does not
  cover; the kubelet and the attach/detach controller check again. The VolumeAttachment carries a copy of
  the inline source and the pod's namespace, so detach works after the pod is gone; pods in different
  namespaces that use one handle on a node share one attachment, detached when the last is gone.

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
      metadata: {name: shared, annotations: {inlet.dev/inline-namespaces: "team-a,team-b"}}
      spec:
        capacity: {storage: 32Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: shared}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: app-a, namespace: team-a}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, volumeHandle: shared}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: app-b, namespace: team-b}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, volumeHandle: shared}}]
      """

  Scenario: With the gate off, an inline volumeHandle is ignored and the volume is ephemeral
    When the simulation runs
    Then pod "app-a" is Running
    And the volume id of "data" in pod "app-a" is csi- and the sha256 of the pod UID and the volume name
    And there are 0 VolumeAttachments

  Scenario: With the gate on, pods in two namespaces share one attachment of the handle
    Given the feature gate "PersistentInlineCSI" is on
    When the simulation runs
    Then pod "app-a" is Running
    And pod "app-b" is Running
    And a VolumeAttachment for handle "shared" of "local.inlet.dev" on "node-1" is attached
    And there is 1 VolumeAttachment
    And the VolumeAttachment for handle "shared" of "local.inlet.dev" on "node-1" carries the inline source for namespace "team-a"
    And the driver got ControllerPublishVolume for handle "shared" 1 time
    And the driver got NodeStageVolume for handle "shared" 1 time
    And the driver got NodePublishVolume for volume "data" of pod "app-a"
    And the driver got NodePublishVolume for volume "data" of pod "app-b"
    And the vol_data.json of "data" in pod "app-b" records mode "Persistent" and driver "local.inlet.dev"

  Scenario: Detach happens when the last pod using the handle is gone
    Given the feature gate "PersistentInlineCSI" is on
    When the simulation runs
    Then pod "app-a" is Running
    And pod "app-b" is Running
    When pod "app-a" is deleted
    Then there is 1 VolumeAttachment
    And the driver got no ControllerUnpublishVolume call
    When all pods are deleted
    Then the driver got ControllerUnpublishVolume for handle "shared" 1 time
    And no VolumeAttachment is left
    And nothing is left on the node

  Scenario: A persistent inline source without volumeHandle fails at attach with an event that says so
    Given the feature gate "PersistentInlineCSI" is on
    And a CSIDriver "persistent-only.inlet.dev" with:
      """
      attachRequired: true
      volumeLifecycleModes: [Persistent]
      """
    And the local driver "persistent-only.inlet.dev" with attach
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: no-handle}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: persistent-only.inlet.dev}}]
      """
    When the simulation runs
    Then pod "no-handle" is Pending
    And pod "no-handle" has a Warning "FailedAttachVolume" event saying "AttachVolume.Attach failed for volume "data" : persistent inline volume "data" of driver persistent-only.inlet.dev has no volumeHandle"

  Scenario: An attach error is reported to every pod waiting on the attachment
    Given the feature gate "PersistentInlineCSI" is on
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata:
        name: never-provisioned
        annotations: {inlet.dev/inline-namespaces: "team-a,team-b", inlet.dev/pre-provision: "false"}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: never-provisioned}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: missing-a, namespace: team-a}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, volumeHandle: never-provisioned}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: missing-b, namespace: team-b}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, volumeHandle: never-provisioned}}]
      """
    When the simulation runs
    Then pod "missing-a" has a Warning "FailedAttachVolume" event saying "AttachVolume.Attach failed for volume "data" : rpc error: code = NotFound desc = volume "never-provisioned" not found"
    And pod "missing-b" has a Warning "FailedAttachVolume" event saying "rpc error: code = NotFound"

  Scenario: A namespace the PersistentVolume does not grant is refused at admission, whatever the handle
    Given the feature gate "PersistentInlineCSI" is on
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: payroll}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: payroll}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: intruder, namespace: team-b}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, volumeHandle: payroll}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: guesser, namespace: team-b}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, volumeHandle: nobody-made-this}}]
      """
    When the simulation runs
    Then pod "intruder" was rejected with "pods "intruder" is forbidden: spec.volumes[0].csi.volumeHandle: Forbidden: PersistentVolume "payroll" does not grant volume handle "payroll" to namespace "team-b" (granted: none)"
    And pod "guesser" was rejected with "spec.volumes[0].csi.volumeHandle: Forbidden: no PersistentVolume of driver "local.inlet.dev" has volume handle "nobody-made-this""
    And the driver got ControllerPublishVolume for handle "payroll" 0 times
    And there is 1 VolumeAttachment

  Scenario: The kubelet and the attach/detach controller refuse what admission did not see
    A pod admitted before the grant was withdrawn (or through another API server) is checked again before
    any attach, stage or publish.
    Given the feature gate "PersistentInlineCSI" is on
    When the simulation runs
    Then pod "app-a" is Running
    When the PersistentVolume "shared" grants its handle to "team-b" only
    And these pods are created without admission:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: late-a, namespace: team-a}
      spec:
        nodeName: node-1
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, volumeHandle: shared}}]
      """
    Then pod "late-a" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "data" : persistent inline volume "data": PersistentVolume "shared" does not grant volume handle "shared" to namespace "team-a" (granted: team-b)"
    And pod "late-a" is Pending
    And pod "app-a" is Running

  Scenario: A grant withdrawn while in use keeps the running pod's volume, and refuses new pods
    Given the feature gate "PersistentInlineCSI" is on
    When the simulation runs
    Then pod "app-a" is Running
    When the PersistentVolume "shared" grants its handle to "team-b" only
    And these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: again-a, namespace: team-a}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, volumeHandle: shared}}]
      """
    Then pod "again-a" was rejected with "PersistentVolume "shared" does not grant volume handle "shared" to namespace "team-a" (granted: team-b)"
    And pod "app-a" is Running
    When all pods are deleted
    Then the driver got ControllerUnpublishVolume for handle "shared" 1 time
    And no VolumeAttachment is left
