Feature: preStop hooks and the grace period
  Stopping a container is `killContainer` (`kuberuntime_container.go`): the Killing event, then the
  container's preStop hook if the grace period (the deletion's, else `terminationGracePeriodSeconds`) is
  above 0, given at most that long (`executePreStopHook`), then StopContainer with the seconds left, never
  under 2. An `exec` hook runs in the container through CRI ExecSync, `sleep` waits, `httpGet` sends a GET
  (`lifecycle/handlers.go`). A failed hook is a `FailedPreStopHook` event that does not carry the hook's
  output, and the container is stopped all the same.

  Scenario: An exec preStop hook runs in the container before it is stopped
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: drains}
      spec:
        containers:
        - name: app
          image: busybox
          command: [sleep, "3600"]
          lifecycle: {preStop: {exec: {command: [sh, -c, "sleep 1; echo drained"]}}}
      """
    When the simulation runs
    Then pod "drains" is Running
    When all pods are deleted
    Then the runtime ran a preStop hook in a container before stopping it
    And pod "drains" has a "Killing" event about spec.containers{app}
    And pod "drains" got no "FailedPreStopHook" event

  Scenario: A failing preStop hook is a FailedPreStopHook event without its output, and the container still stops
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: refuses}
      spec:
        containers:
        - name: app
          image: busybox
          command: [sleep, "3600"]
          lifecycle: {preStop: {exec: {command: [sh, -c, "echo token=hunter2; exit 3"]}}}
      """
    When the simulation runs
    Then pod "refuses" is Running
    When all pods are deleted
    Then pod "refuses" has a "FailedPreStopHook" event about spec.containers{app}
    And pod "refuses" has a Warning "FailedPreStopHook" event saying "PreStopHook failed"
    And pod "refuses" got no event saying "hunter2"
    And nothing is left on the node

  Scenario: A preStop hook that outlasts the grace period does not hold the pod up
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: lingers}
      spec:
        terminationGracePeriodSeconds: 1
        containers:
        - name: app
          image: busybox
          command: [sleep, "3600"]
          lifecycle: {preStop: {sleep: {seconds: 3600}}}
        - name: helper
          image: busybox
          command: [sleep, "3600"]
          lifecycle: {preStop: {exec: {command: [sleep, "3600"]}}}
      """
    When the simulation runs
    Then pod "lingers" is Running
    When all pods are deleted
    Then pod "lingers" got no "FailedPreStopHook" event
    And nothing is left on the node

  Scenario: A pod deleted with no grace period runs no preStop hook
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: abrupt}
      spec:
        terminationGracePeriodSeconds: 0
        containers:
        - name: app
          image: busybox
          command: [sleep, "3600"]
          lifecycle: {preStop: {exec: {command: [sh, -c, "sleep 1"]}}}
      """
    When the simulation runs
    Then pod "abrupt" is Running
    When pod "abrupt" is deleted
    Then the runtime ran no hook
    And pod "abrupt" has a "Killing" event about spec.containers{app}

  Scenario: An httpGet preStop hook sends a GET with its headers to the hook's host and port
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: calls-home}
      spec:
        containers:
        - name: app
          image: busybox
          command: [sleep, "3600"]
          ports: [{name: admin, containerPort: HTTP_PORT}]
          lifecycle:
            preStop:
              httpGet: {host: 127.0.0.1, port: admin, path: /drain, httpHeaders: [{name: X-Reason, value: shutdown}]}
      """
    And an HTTP server on 127.0.0.1 that records its requests
    When the simulation runs
    Then pod "calls-home" is Running
    When all pods are deleted
    Then the HTTP server got "GET /drain HTTP/1.1" with the header "x-reason: shutdown"
    And pod "calls-home" got no "FailedPreStopHook" event
