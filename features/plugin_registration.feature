Feature: Drivers registering themselves through the plugin watcher
  The kubelet watches its plugins registry dir (`/var/lib/kubelet/plugins_registry`) for registration
  sockets. For each new one it calls GetInfo, checks the plugin type, validates the CSI versions, calls the
  driver's NodeGetInfo, installs the driver in the node's CSINode object, and tells the plugin how it went
  with NotifyRegistrationStatus; a socket that goes away deregisters its driver
  (`pkg/kubelet/pluginmanager`, `operation_generator.go`, `csi_plugin.go` RegistrationHandler).

  Background:
    Given the kubelet watches a plugins registry
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      """

  Scenario: A pod waiting for an unregistered driver starts once the driver registers itself
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "data" : kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name local.inlet.dev not found in the list of registered CSI drivers"
    When the local driver "local.inlet.dev" registers through the plugins registry
    Then node "node-1" lists driver "local.inlet.dev" in its CSINode
    And pod "web" becomes Running
    And the driver got NodePublishVolume for volume "data" of pod "web"

  Scenario: A driver whose socket goes away is deregistered, and tears its volumes down once it is back
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    And the local driver "local.inlet.dev" registers through the plugins registry
    Then pod "web" becomes Running
    When the local driver "local.inlet.dev" stops
    Then node "node-1" does not list driver "local.inlet.dev" in its CSINode
    When the local driver "local.inlet.dev" registers through the plugins registry
    Then node "node-1" lists driver "local.inlet.dev" in its CSINode
    When all pods are deleted
    Then the driver got NodeUnpublishVolume for volume "data" of pod "web"
    And nothing is left on the node

  Scenario Outline: A registration the kubelet refuses: <why>
    When the simulation runs
    And a plugin "<name>" of type "<type>" with versions "<versions>" offers itself
    Then the plugin "<name>" is refused with "<refusal>"
    And node "node-1" does not list driver "<name>" in its CSINode

    Examples:
      | why                     | name          | type         | versions    | refusal                                                                                                                                                                                            |
      | not a CSI plugin        | gpu.inlet.dev | DevicePlugin | v1beta1     | RegisterPlugin error -- no handler registered for plugin type: DevicePlugin at socket                                                                                                              |
      | no versions             | x.inlet.dev   | CSIPlugin    |             | RegisterPlugin error -- plugin validation failed with err: validation failed for CSI Driver x.inlet.dev at endpoint                                                                                |
      | no versions             | x.inlet.dev   | CSIPlugin    |             | kubernetes.io/csi: ValidatePlugin for CSI driver "x.inlet.dev" failed. Plugin returned an empty list for supported versions                                                                       |
      | only CSI 2.x            | x.inlet.dev   | CSIPlugin    | 2.0.0       | None of the versions specified ["2.0.0"] are supported. err=could not find a highest supported version from versions ([2.0.0]) reported by this driver: <nil>                                      |
      | only CSI 0.x            | x.inlet.dev   | CSIPlugin    | 0.3.0,0.2.0 | None of the versions specified ["0.3.0" "0.2.0"] are supported. err=highest supported version reported by driver is 0.3.0, must be v1.x                                                           |

  Scenario Outline: A driver whose CSINode entry the API would refuse is refused: <why>
    CSINode holds a node id of at most 192 characters and a driver name the API server takes
    (`ValidateCSINode`); the kubelet's `updateCSINode` fails with the API's error, and the driver is
    unregistered. A megabyte-long node id is not repeated whole in the reason.

    When the simulation runs
    And a CSI driver "<name>" whose node id is <length> characters long offers itself
    Then the plugin "<name>" is refused with "<refusal>"
    And node "node-1" does not list driver "<name>" in its CSINode

    Examples:
      | why                    | name          | length  | refusal                                                                                                                                   |
      | a node id of 193       | id.inlet.dev  | 193     | error updating CSINode object with CSI driver node info: CSINode.storage.k8s.io "node-1" is invalid: spec.drivers[0].nodeID: Invalid value |
      | a megabyte's node id   | id.inlet.dev  | 1048576 | (1048512 more bytes)": must be 192 characters or less                                                                                     |
      | a name the API refuses | id_inlet.dev  | 10      | spec.drivers[0].name: Invalid value: "id_inlet.dev": a lowercase RFC 1123 subdomain                                                       |

  Scenario: A driver whose node id is 192 characters long registers
    When the simulation runs
    And a CSI driver "id.inlet.dev" whose node id is 192 characters long offers itself
    Then node "node-1" lists driver "id.inlet.dev" in its CSINode

  Scenario: A second driver of a registered name must support a higher CSI version
    Given the local driver "local.inlet.dev"
    When the simulation runs
    And a plugin "local.inlet.dev" of type "CSIPlugin" with versions "1.0.0" offers itself
    Then the plugin "local.inlet.dev" is refused with "kubernetes.io/csi: ValidatePlugin for CSI driver "local.inlet.dev" failed. Another driver with the same name is already registered with a higher supported version: "1.0.0""
    And node "node-1" lists driver "local.inlet.dev" in its CSINode
