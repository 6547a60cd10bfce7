Feature: Volume stats and health
  The kubelet's stats provider asks every mounted volume for its metrics every --volume-stats-agg-period
  (volume_stat_calculator.go): NodeGetVolumeStats for a CSI volume whose driver has GET_VOLUME_STATS.
  With the CSIVolumeHealth gate (alpha, off by default) it also reads the volume's condition, and an
  abnormal one becomes a Warning event on the pod, VolumeConditionAbnormal, "Volume <name>: <message>",
  at each pass while it lasts. Without the gate the condition is not read and no event is made.

  Background:
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      podInfoOnMount: true
      """
    And the kubelet asks for volume stats every 200 ms
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """

  Scenario: A volume whose content goes missing is reported abnormal, with the gate
    Given the feature gate "CSIVolumeHealth" is on
    When the simulation runs
    Then pod "web" is Running
    And the stats of "data" in pod "web" are not abnormal
    When the driver "local.inlet.dev" loses the content of "data" in pod "web"
    Then pod "web" has a Warning "VolumeConditionAbnormal" event saying "Volume data: content "
    And the stats of "data" in pod "web" are abnormal

  Scenario: Without the gate the stats are polled and the condition is not read
    When the simulation runs
    Then pod "web" is Running
    And the stats of "data" in pod "web" have no condition
    When the driver "local.inlet.dev" loses the content of "data" in pod "web"
    And the kubelet asks for the stats of "data" in pod "web" again
    Then pod "web" has no "VolumeConditionAbnormal" event
