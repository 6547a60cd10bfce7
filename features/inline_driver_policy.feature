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
