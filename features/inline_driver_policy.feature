Feature: An operator policy for inline drivers
  The successor of PodSecurityPolicy's allowedCSIDrivers: when a list is configured, only the drivers it
  names may be used inline, checked when the pod is admitted. No list allows every driver; an empty list
  allows none. Beside it, per namespace and with the PersistentInlineCSI gate (the KEP's alpha): a driver's
  ephemeral volume profile against the namespace's Pod Security level, as OpenShift's CSI inline volume
  admission checks it.

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

  Scenario Outline: A namespace's Pod Security level bounds the profile of the drivers it may use inline
    OpenShift's CSI inline volume admission, with its label: a CSIDriver says which Pod Security level its
    inline volumes are safe at (unlabelled: privileged), and a namespace enforcing a lower level refuses it.
    Given the feature gate "PersistentInlineCSI" is on
    And the manifests:
      """
      apiVersion: v1
      kind: Namespace
      metadata: {name: apps, labels: {pod-security.kubernetes.io/enforce: <level>}}
      ---
      apiVersion: storage.k8s.io/v1
      kind: CSIDriver
      metadata: {name: local.inlet.dev, labels: {security.openshift.io/csi-ephemeral-volume-profile: <profile>}}
      spec: {volumeLifecycleModes: [Ephemeral]}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: app, namespace: apps}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then <outcome>

    Examples:
      | level      | profile    | outcome |
      | restricted | restricted | pod "app" is Running |
      | baseline   | restricted | pod "app" is Running |
      | baseline   | baseline   | pod "app" is Running |
      | privileged | privileged | pod "app" is Running |
      | restricted | baseline   | pod "app" was rejected with "pods "app" is forbidden: spec.volumes[0].csi.driver: Forbidden: inline CSI driver "local.inlet.dev" has the ephemeral volume profile "baseline" (security.openshift.io/csi-ephemeral-volume-profile), above namespace "apps"'s Pod Security level "restricted" (pod-security.kubernetes.io/enforce)" |
      | baseline   | privileged | pod "app" was rejected with "has the ephemeral volume profile "privileged"" |
      | restricted | unknown    | pod "app" was rejected with "has the ephemeral volume profile "privileged"" |

  Scenario: An unlabelled driver is privileged: refused where a namespace enforces restricted, allowed elsewhere
    Given the feature gate "PersistentInlineCSI" is on
    And the manifests:
      """
      apiVersion: v1
      kind: Namespace
      metadata: {name: locked, labels: {pod-security.kubernetes.io/enforce: restricted}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: locked-app, namespace: locked}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "locked-app" was rejected with "inline CSI driver "local.inlet.dev" has the ephemeral volume profile "privileged""
    And pod "web" is Running
