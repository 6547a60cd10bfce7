Feature: Generic ephemeral volumes
  A pod's volumes[].ephemeral.volumeClaimTemplate becomes the claim "<pod>-<volume>", which the
  ephemeral-volume controller creates with the pod as its controlling owner; the external-provisioner
  creates its volume (CreateVolume "pvc-<claim uid>") once the pod is on a node (WaitForFirstConsumer),
  the PV controller binds it, and the kubelet mounts it as any PV. When the pod is gone the garbage
  collector deletes the claim, and the class's reclaimPolicy Delete deletes the volume and its PV. A claim
  of that name the pod does not own is refused by the kubelet (desired_state_of_world_populator.go,
  ephemeral.VolumeIsForPod).

  Background:
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
      metadata:
        name: local
        annotations: {storageclass.kubernetes.io/is-default-class: "true"}
      provisioner: local.inlet.dev
      volumeBindingMode: WaitForFirstConsumer
      """

  Scenario: The claim is made for the pod, provisioned, and deleted with it
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: scratch, mountPath: /scratch}]}]
        volumes:
        - name: scratch
          ephemeral:
            volumeClaimTemplate:
              metadata: {labels: {purpose: scratch}}
              spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
      """
    When the simulation runs
    Then pod "web" is Running
    And the claim "default/web-scratch" is bound and controlled by pod "web"
    And the driver created the volume of claim "default/web-scratch"
    When all pods are deleted
    Then no claim or PersistentVolume is left
    And every volume the driver created was deleted
    And nothing is left on the node

  Scenario: A claim of that name that the pod does not own is refused
    Given the manifests:
      """
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: web-scratch}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: scratch, mountPath: /scratch}]}]
        volumes:
        - name: scratch
          ephemeral:
            volumeClaimTemplate:
              spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
      """
    When the simulation runs
    Then pod "web" is Pending
    And pod "web" has a Warning "FailedMount" event saying "PVC default/web-scratch was not created for pod default/web (pod is not owner)"
