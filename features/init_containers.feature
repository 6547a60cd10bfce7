Feature: Init containers and sidecars
  Init containers run before the regular containers, one at a time and each to completion
  (`kuberuntime_manager.go` computePodActions); the pod stays Pending while one runs. A failed init
  container fails the pod under restartPolicy Never, and is restarted with the crash-loop back-off
  otherwise (`kubelet_pods.go` getPhase). A sidecar (an init container with restartPolicy Always) starts in
  order, keeps running beside the regular containers, and does not count for the pod's completion. The
  Initialized condition is `status/generate.go` GeneratePodInitializedCondition's.

  Background:
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      """

  Scenario: Init containers run in order to completion before the regular container, and see the volume
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: staged, annotations: {inlet.dev/expected-phase: Succeeded}}
      spec:
        restartPolicy: Never
        initContainers:
        - {name: first, image: busybox, command: [sh, -c, "echo first ran"]}
        - name: second
          image: busybox
          command: [sh, -c, "test -d /data && echo second saw the volume"]
          volumeMounts: [{name: data, mountPath: /data}]
        containers:
        - {name: app, image: busybox, command: [sh, -c, "echo app ran"]}
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "staged" ends Succeeded
    And pod "staged" started its containers in the order "first, second, app"
    And container "first" of pod "staged" ended with exit code 0 and reason "Completed"
    And the log of container "second" of pod "staged" says "second saw the volume"
    And pod "staged" has condition "Initialized" "True" with reason "PodCompleted"
    And pod "staged" has condition "Ready" "False" with reason "PodCompleted"
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A failed init container under restartPolicy Never fails the pod, and no regular container starts
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: no-init, annotations: {inlet.dev/expected-phase: Failed}}
      spec:
        restartPolicy: Never
        initContainers: [{name: setup, image: busybox, command: [sh, -c, "echo cannot set up; exit 2"]}]
        containers:
        - name: app
          image: busybox
          command: [sleep, "3600"]
          volumeMounts: [{name: data, mountPath: /data}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "no-init" ends Failed
    And container "setup" of pod "no-init" ended with exit code 2 and reason "Error"
    And container "app" of pod "no-init" never started
    And pod "no-init" has condition "Initialized" "False" with reason "ContainersNotInitialized" and message "containers with incomplete status: [setup]"
    And the API status of container "app" of pod "no-init" waits with reason "PodInitializing"
    And the driver got NodeUnpublishVolume for volume "data" of pod "no-init"

  Scenario: A failing init container is restarted with the crash-loop back-off while the pod stays Pending
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: retrying, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        initContainers: [{name: setup, image: busybox, command: ["false"]}]
        containers: [{name: app, image: busybox}]
      """
    When the simulation runs
    Then container "setup" of pod "retrying" is restarted at least 2 times
    And pod "retrying" is Pending
    And pod "retrying" has a Warning "BackOff" event saying "Back-off restarting failed container setup in pod retrying_default("
    And container "app" of pod "retrying" never started
    And the API status of container "setup" of pod "retrying" was last terminated with exit code 1 and reason "Error"

  Scenario: A sidecar starts before the regular container, keeps running, and does not hold up completion
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: with-sidecar, annotations: {inlet.dev/expected-phase: Succeeded}}
      spec:
        restartPolicy: Never
        initContainers: [{name: proxy, image: busybox, restartPolicy: Always, command: [sleep, "3600"]}]
        containers: [{name: app, image: busybox, command: [sh, -c, "echo done"]}]
      """
    When the simulation runs
    Then pod "with-sidecar" ends Succeeded
    And pod "with-sidecar" started its containers in the order "proxy, app"
    And pod "with-sidecar" has condition "Initialized" "True" with reason "PodCompleted"
    When all pods are deleted
    Then nothing is left on the node
