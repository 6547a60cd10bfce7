Feature: Admission refuses what the API server would
  The embedded API validates objects with the API server's rules and words (pkg/apis/core/validation), so a
  manifest kubelet-sim accepts is one a real cluster accepts too.

  Scenario: A pod volume name must be a DNS label
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      """
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: long}
      spec:
        containers: [{name: app, image: busybox}]
        volumes: [{name: a-volume-name-that-is-longer-than-sixty-three-characters-is-refused, csi: {driver: local.inlet.dev}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: dotted}
      spec:
        containers: [{name: app, image: busybox}]
        volumes: [{name: my.data, csi: {driver: local.inlet.dev}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: upper}
      spec:
        containers: [{name: app, image: busybox}]
        volumes: [{name: Data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "long" was rejected with "Pod "long" is invalid: spec.volumes[0].name: Invalid value: "a-volume-name-that-is-longer-than-sixty-three-characters-is-refused": must be no more than 63 characters"
    And pod "dotted" was rejected with "spec.volumes[0].name: Invalid value: "my.data": must not contain dots"
    And pod "upper" was rejected with "spec.volumes[0].name: Invalid value: "Data": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"

  Scenario: A PV's CSI secret references need a namespace
    Given the local driver "local.inlet.dev"
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: no-namespace}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        csi:
          driver: local.inlet.dev
          volumeHandle: no-namespace
          nodePublishSecretRef: {name: creds}
          controllerPublishSecretRef: {name: creds}
      """
    When the simulation runs
    Then the PersistentVolume "no-namespace" was rejected with "PersistentVolume "no-namespace" is invalid: [spec.csi.controllerPublishSecretRef.namespace: Required value, spec.csi.nodePublishSecretRef.namespace: Required value]"
