Feature: Containers run to completion
  The kubelet follows containers after they start: a relist of the runtime (the PLEG) sees them exit; the
  pod's restartPolicy decides between a restart, with the crash-loop back-off (kuberuntime_manager.go), and
  an end: Succeeded when every container exited 0, else Failed (getPhase, kubelet_pods.go). A pod that
  ended has its volumes torn down. cri-fake runs small commands (true, false, sleep, sh -c with exit, echo,
  cat, test), reading paths through the container's mounts.

  Background:
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      """

  Scenario: A pod whose command checks its volume ends Succeeded, and its volume is torn down
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: check, annotations: {inlet.dev/expected-phase: Succeeded}}
      spec:
        restartPolicy: Never
        containers:
        - name: app
          image: busybox
          command: [sh, -c, "test -d /data && echo the volume is there"]
          volumeMounts: [{name: data, mountPath: /data}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "check" ends Succeeded
    And container "app" of pod "check" ended with exit code 0 and reason "Completed"
    And the log of container "app" of pod "check" says "the volume is there"
    And the driver got NodeUnpublishVolume for volume "data" of pod "check"
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A failing command with restartPolicy Never ends Failed
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: broken, annotations: {inlet.dev/expected-phase: Failed}}
      spec:
        restartPolicy: Never
        containers: [{name: app, image: busybox, command: [sh, -c, "echo giving up; exit 3"]}]
      """
    When the simulation runs
    Then pod "broken" ends Failed
    And container "app" of pod "broken" ended with exit code 3 and reason "Error"
    And the log of container "app" of pod "broken" says "giving up"

  Scenario: OnFailure restarts a failed container, and a success ends the pod
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: once, annotations: {inlet.dev/expected-phase: Succeeded}}
      spec:
        restartPolicy: OnFailure
        containers: [{name: app, image: busybox, command: ["true"]}]
      """
    When the simulation runs
    Then pod "once" ends Succeeded
    And container "app" of pod "once" ended with exit code 0 and reason "Completed"

  Scenario: A crashing container with restartPolicy Always is restarted with the crash-loop back-off
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: crash}
      spec:
        containers: [{name: app, image: busybox, command: ["false"]}]
      """
    When the simulation runs
    Then container "app" of pod "crash" is restarted at least 3 times
    And pod "crash" is Running
    And pod "crash" has a Warning "BackOff" event saying "Back-off restarting failed container app in pod crash_default("

  Scenario: A runtime call that hangs past the runtime request timeout fails, and is retried
    The kubelet gives each RuntimeService call its runtimeRequestTimeout (2 min upstream, 500 ms here);
    a call that hangs past it is abandoned with DEADLINE_EXCEEDED, and the container is created again in
    the pod's sandbox after the pod workers' back-off.
    Given the runtime hangs 3000ms in CreateContainer once
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "Failed" event saying "Error: rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    And pod "web" is Running
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A pod removed from the API without a graceful deletion is stopped and its volumes torn down
    The kubelet stops what runs for a pod that left the API by a force delete (`HandlePodRemoves`): its
    containers and sandbox, then its volumes and directory.
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: gone}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "gone" is Running
    When pod "gone" is force-deleted
    Then the driver got NodeUnpublishVolume for volume "data" of pod "gone"
    And nothing is left of pod "gone" on "node-1"

  @mounts
  Scenario: A deleted pod turns Failed from its killed container before it leaves the API
    Since 1.27 the kubelet gives a deleted pod a terminal phase once its containers are stopped
    (`podIsTerminal`), each stopped within its grace period (`killContainer`, 2 s at least); the pod stays
    until its volumes are torn down, here held up by a file open in the volume.
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: held}
      spec:
        terminationGracePeriodSeconds: 1
        containers:
        - name: app
          image: busybox
          command: [sleep, "3600"]
          volumeMounts: [{name: data, mountPath: /data}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "held" is Running
    When a process holds "/data:busy.txt" open in pod "held"
    And pod "held" is being deleted
    Then pod "held" becomes Failed
    And container "app" of pod "held" ended with exit code 137 and reason "Error"
    And pod "held" has condition "Ready" "False" with reason "PodFailed"
    And pod "held" has condition "PodReadyToStartContainers" "False"
    When the process lets go of its files
    Then nothing is left of pod "held" on "node-1"

  @mounts
  Scenario: A deleted pod's containers that never ran are ContainerStatusUnknown, and a crashed one shows its last run
    TerminatePod (`status_manager.go`) ends the status of a pod that will run nothing again: once the pod
    initialized, a container that never started is terminated with ContainerStatusUnknown and 137; one
    waiting out a crash-loop back-off is not restarted, so it shows the run it ended with.
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: mixed}
      spec:
        terminationGracePeriodSeconds: 1
        containers:
        - name: app
          image: busybox
          command: [sleep, "3600"]
          volumeMounts: [{name: data, mountPath: /data}]
        - {name: crashes, image: busybox, command: [sh, -c, "exit 2"]}
        - {name: unpulled, image: example.inlet.dev/absent:v1, imagePullPolicy: Never}
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then the API status of container "unpulled" of pod "mixed" waits with reason "ErrImageNeverPull"
    And the API status of container "crashes" of pod "mixed" waits with reason "CrashLoopBackOff"
    When a process holds "/data:busy.txt" open in pod "mixed"
    And pod "mixed" is being deleted
    Then pod "mixed" becomes Failed
    And the API status of container "unpulled" of pod "mixed" is terminated with exit code 137 and reason "ContainerStatusUnknown" saying "The container could not be located when the pod was terminated"
    And the API status of container "crashes" of pod "mixed" is terminated with exit code 2 and reason "Error"
    And the API status of container "app" of pod "mixed" is terminated with exit code 137 and reason "Error"
    When the process lets go of its files
    Then nothing is left of pod "mixed" on "node-1"
