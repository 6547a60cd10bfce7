Feature: An operator policy for inline drivers
  The successor of PodSecurityPolicy's allowedCSIDrivers: when a list is configured, only the drivers it
  names may be used inline, checked when the pod is admitted. No list allows every driver; an empty list
  allows none.

  Background:
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      """
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """

  Scenario: No policy allows any driver inline
    When the simulation runs
    Then pod "web" is Running

  Scenario: A listed driver is allowed
    Given inline CSI drivers are limited to "local.inlet.dev,other.example.com"
    When the simulation runs
    Then pod "web" is Running

  Scenario: A driver that is not listed is refused at admission with a clear message
    Given inline CSI drivers are limited to "other.example.com"
    When the simulation runs
    Then pod "web" was rejected with "pods "web" is forbidden: spec.volumes[0].csi.driver: Forbidden: inline CSI driver "local.inlet.dev" is not allowed by the inline-driver policy (allowed: other.example.com)"
    And the driver got no NodePublishVolume call

  Scenario: An empty list allows no driver inline
    Given inline CSI drivers are limited to ""
    When the simulation runs
    Then pod "web" was rejected with "(allowed: none)"

  Scenario: The policy cannot be got round by creating the pod again with the refused volume
    Given inline CSI drivers are limited to "local.inlet.dev"
    When the simulation runs
    Then pod "web" is Running
    When these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: other.example.com}}]
      """
    Then creating pod "web" again was rejected with "inline CSI driver "other.example.com" is not allowed"
    And pod "web" is Running

  Scenario: The policy is for inline volumes only: a PV of a driver not listed is mounted
    Given inline CSI drivers are limited to "other.example.com"
    And a CSIDriver "local.inlet.dev" with:
      """
      attachRequired: false
      volumeLifecycleModes: [Persistent]
      """
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: pv-local}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: pv-local}
        claimRef: {namespace: default, name: claim}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: claim}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: through-a-claim}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: claim}}]
      """
    When the simulation runs
    Then pod "through-a-claim" is Running
    And pod "web" was rejected with "is not allowed by the inline-driver policy"
