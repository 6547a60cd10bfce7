Feature: Secrets of persistent inline volumes (the KEP-596 draft, feature gate PersistentInlineCSI)
  A persistent inline volume is granted by the PersistentVolume of its handle, and attaches and stages with
  that PV's controllerPublishSecretRef and nodeStageSecretRef, as a claim of it would: the attacher reads
  only secrets a PV names, never Secrets of whichever namespace a pod is in, and a namespace deleted while
  its pod's volume is attached cannot strand the detach. The draft's controllerPublishSecretRef and
  nodeStageSecretRef on the inline source are refused; nodePublishSecretRef stays the pod's, read in its
  namespace. A detach whose PV secret was deleted fails, the volume stays attached, and the detach goes
  through once the secret is back.

  Background:
    Given the feature gate "PersistentInlineCSI" is on
    And the local driver "local.inlet.dev" with attach
    And a CSIDriver "local.inlet.dev" with:
      """
      attachRequired: true
      volumeLifecycleModes: [Persistent]
      """
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: vault, annotations: {inlet.dev/inline-namespaces: team-a}}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        csi:
          driver: local.inlet.dev
          volumeHandle: vault
          controllerPublishSecretRef: {name: attach-creds, namespace: storage-admin}
          nodeStageSecretRef: {name: stage-creds, namespace: storage-admin}
      ---
      apiVersion: v1
      kind: Secret
      metadata: {name: attach-creds, namespace: storage-admin}
      stringData: {user: attacher, password: s3cr3t-password}
      ---
      apiVersion: v1
      kind: Secret
      metadata: {name: stage-creds, namespace: storage-admin}
      stringData: {key: s3cr3t-password}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: secure, namespace: team-a}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, volumeHandle: vault}}]
      """

  Scenario: Attach and stage read the granting PersistentVolume's secrets
    When the simulation runs
    Then pod "secure" is Running
    And the ControllerPublishVolume call for handle "vault" has secret keys "password,user"
    And the NodeStageVolume call for handle "vault" has secret keys "key"
    And the only secrets read were "storage-admin/attach-creds,storage-admin/stage-creds"
    And no report, log or call carries a secret value

  Scenario: An inline source that names attach or stage secrets of its own is refused
    When the simulation runs
    And these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: own-secrets, namespace: team-a}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes:
          - name: data
            csi: {driver: local.inlet.dev, volumeHandle: vault, controllerPublishSecretRef: {name: mine}}
      """
    Then pod "own-secrets" was rejected with "spec.volumes[0].csi.controllerPublishSecretRef: Forbidden: a persistent inline volume uses the secrets of the PersistentVolume that grants it"

  Scenario: A namespace deleted while its pod's volume is attached does not strand the detach
    When the simulation runs
    Then pod "secure" is Running
    When the namespace "team-a" is deleted
    Then no VolumeAttachment is left
    And the driver got ControllerUnpublishVolume for handle "vault" 1 time
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A detach whose secret was deleted fails, and goes through once the secret is back
    When the simulation runs
    And the secret "storage-admin/attach-creds" is deleted
    And pod "secure" is deleted
    Then the VolumeAttachment for handle "vault" of "local.inlet.dev" on "node-1" has a detach error saying "secrets "attach-creds" not found in namespace "storage-admin""
    And there is 1 VolumeAttachment
    When these manifests are applied:
      """
      apiVersion: v1
      kind: Secret
      metadata: {name: attach-creds, namespace: storage-admin}
      stringData: {user: attacher, password: s3cr3t-password}
      """
    Then no VolumeAttachment is left
    And the driver got ControllerUnpublishVolume for handle "vault" 1 time
