Feature: Secrets of persistent inline volumes (the KEP-596 draft, feature gate PersistentInlineCSI)
  The draft's controllerPublishSecretRef and nodeStageSecretRef name secrets in the pod's namespace, like
  nodePublishSecretRef. The attachment keeps the reference, so the detach reads the secret again; if it was
  deleted, the detach fails, the volume stays attached, and the detach goes through once the secret is back.

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
      metadata: {name: vault}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: vault}
      ---
      apiVersion: v1
      kind: Secret
      metadata: {name: attach-creds, namespace: team-a}
      stringData: {user: attacher, password: s3cr3t-password}
      ---
      apiVersion: v1
      kind: Secret
      metadata: {name: stage-creds, namespace: team-a}
      stringData: {key: s3cr3t-password}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: secure, namespace: team-a}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes:
          - name: data
            csi:
              driver: local.inlet.dev
              volumeHandle: vault
              controllerPublishSecretRef: {name: attach-creds}
              nodeStageSecretRef: {name: stage-creds}
      """

  Scenario: Attach and stage read their secrets from the pod's namespace
    When the simulation runs
    Then pod "secure" is Running
    And the ControllerPublishVolume call for handle "vault" has secret keys "password,user"
    And the NodeStageVolume call for handle "vault" has secret keys "key"
    And the only secrets read were "team-a/attach-creds,team-a/stage-creds"
    And no report, log or call carries a secret value

  Scenario: A detach whose secret was deleted fails, and goes through once the secret is back
    When the simulation runs
    And the secret "team-a/attach-creds" is deleted
    And pod "secure" is deleted
    Then the VolumeAttachment for handle "vault" of "local.inlet.dev" on "node-1" has a detach error saying "secrets "attach-creds" not found in namespace "team-a""
    And there is 1 VolumeAttachment
    When these manifests are applied:
      """
      apiVersion: v1
      kind: Secret
      metadata: {name: attach-creds, namespace: team-a}
      stringData: {user: attacher, password: s3cr3t-password}
      """
    Then no VolumeAttachment is left
    And the driver got ControllerUnpublishVolume for handle "vault" 1 time
