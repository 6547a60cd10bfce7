Feature: The pod status a kubelet writes
  The pod's conditions are generated as `status/generate.go` does (PodReadyToStartContainers, Initialized,
  Ready, ContainersReady, then PodScheduled, after the conditions others own, which are kept); a condition's
  lastTransitionTime changes only when its status does (`status_manager.go`). Container statuses carry the
  runtime's containerID (`<runtime>://<id>`) and imageID, the times the runtime reports, the previous run as
  lastState, and the crash-loop back-off's message (`kuberuntime_manager.go` doBackOff).

  Scenario: A running pod is ready, with every condition in upstream's order and the runtime's ids
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox}]
      """
    When the simulation runs
    Then pod "web" is Running
    And pod "web" has condition "Ready" "True"
    And pod "web" has the conditions "PodReadyToStartContainers, Initialized, Ready, ContainersReady, PodScheduled" in this order
    And the API status of container "app" of pod "web" runs with a containerID starting "cri-fake://" and an imageID

  Scenario: A crash-looping container makes the pod unready, with the back-off's message and its last run
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: crash}
      spec:
        containers: [{name: app, image: busybox, command: [sh, -c, "exit 1"]}]
      """
    When the simulation runs
    Then pod "crash" has condition "Ready" "False" with reason "ContainersNotReady" and message "containers with unready status: [app]"
    And pod "crash" has condition "ContainersReady" "False" with reason "ContainersNotReady" and message "containers with unready status: [app]"
    And the API status of container "app" of pod "crash" waits with reason "CrashLoopBackOff" and a message starting "back-off 200ms restarting failed container=app pod=crash_default("
    And the API status of container "app" of pod "crash" was last terminated with exit code 1 and reason "Error"
    And the condition "PodScheduled" of pod "crash" keeps its transition time while container "app" restarts twice
    And pod "crash" is Running

  Scenario: A completed pod is not ready, with reason PodCompleted, and its exited container is not killed
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: job, annotations: {inlet.dev/expected-phase: Succeeded}}
      spec:
        restartPolicy: Never
        containers: [{name: app, image: busybox, command: ["true"]}]
      """
    When the simulation runs
    Then pod "job" ends Succeeded
    And pod "job" has condition "Ready" "False" with reason "PodCompleted"
    And pod "job" has condition "ContainersReady" "False" with reason "PodCompleted"
    And pod "job" has condition "PodReadyToStartContainers" "False"
    And pod "job" got no "Killing" event
    When all pods are deleted
    Then pod "job" got no "Killing" event

  Scenario: A readiness gate holds Ready until its condition, set by another controller, is True
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: gated}
      spec:
        readinessGates: [{conditionType: example.com/load-balanced}]
        containers: [{name: app, image: busybox}]
      """
    When the simulation runs
    Then pod "gated" has condition "Ready" "False" with reason "ReadinessGatesNotReady" and message "corresponding condition of pod readiness gate "example.com/load-balanced" does not exist."
    And pod "gated" has condition "ContainersReady" "True"
    When another controller sets the condition "example.com/load-balanced" of pod "gated" to "True"
    Then pod "gated" has condition "Ready" "True"
    And pod "gated" has condition "example.com/load-balanced" "True"

  Scenario: Waiting too long for volumes is no event of its own; the mount's failure is
    Since 1.28 the kubelet records no event when WaitForAttachAndMount only timed out (`kubelet.go` SyncPod
    skips `wait.Interrupted` errors); the reconciler's FailedMount says what is wrong.
    Given the kubelet waits 200 ms for volumes
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: stuck, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers: [{name: app, image: busybox}]
        volumes: [{name: data, csi: {driver: ghost.example.com}}]
      """
    When the simulation runs
    Then pod "stuck" has a Warning "FailedMount" event saying "driver name ghost.example.com not found in the list of registered CSI drivers"
    When 600 ms pass
    Then pod "stuck" got no event saying "Unable to attach or mount volumes"
    And pod "stuck" is Pending

  Scenario: A container's events name it in involvedObject.fieldPath; a volume's events are the pod's
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: fields}
      spec:
        initContainers: [{name: setup, image: busybox, command: ["true"]}]
        containers: [{name: app, image: busybox, command: [sleep, "3600"]}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: stuck, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers: [{name: app, image: busybox}]
        volumes: [{name: data, csi: {driver: missing.inlet.dev}}]
      """
    When the simulation runs
    Then pod "fields" is Running
    And pod "fields" has a "Pulled" event about spec.initContainers{setup}
    And pod "fields" has a "Started" event about spec.initContainers{setup}
    And pod "fields" has a "Started" event about spec.containers{app}
    And pod "stuck" has a "FailedMount" event about the pod itself
    When all pods are deleted
    Then pod "fields" has a "Killing" event about spec.containers{app}
