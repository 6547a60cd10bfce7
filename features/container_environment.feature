Feature: A container's environment
  The kubelet makes each container's environment (`kubelet_pods.go` makeEnvironmentVariables): `envFrom`
  sources first, then each `env` entry in order, a literal expanded with `$(VAR)` against the variables
  before it, a `valueFrom` read from a Secret or ConfigMap of the pod's namespace or a field of the pod.
  Command and args are expanded against the result, and so is `subPathExpr` (`ExpandContainerVolumeMounts`).
  A Secret, ConfigMap or key that is not there fails the container with CreateContainerConfigError and
  upstream's text, unless the reference is optional; the pod starts once it is there.

  Scenario: Variables from a ConfigMap, a Secret, the pod and other variables reach the command
    Given the manifests:
      """
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: settings}
      data: {greeting: hello, color: blue}
      ---
      apiVersion: v1
      kind: Secret
      metadata: {name: creds}
      stringData: {username: admin, password: s3cr3t-password}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: env-demo, annotations: {inlet.dev/expected-phase: Succeeded}}
      spec:
        restartPolicy: Never
        containers:
        - name: app
          image: busybox
          envFrom: [{configMapRef: {name: settings}, prefix: CFG_}]
          env:
          - {name: GREETING, valueFrom: {configMapKeyRef: {name: settings, key: greeting}}}
          - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
          - {name: USERNAME, valueFrom: {secretKeyRef: {name: creds, key: username}}}
          - {name: PASSWORD, valueFrom: {secretKeyRef: {name: creds, key: password}}}
          - {name: MISSING_OK, valueFrom: {secretKeyRef: {name: absent, key: x, optional: true}}}
          - {name: MESSAGE, value: "$(GREETING), $(POD_NAME)!"}
          command: [sh, -c, "echo $(MESSAGE); echo user $USERNAME; echo color $CFG_color"]
      """
    When the simulation runs
    Then pod "env-demo" ends Succeeded
    And the log of container "app" of pod "env-demo" says "hello, env-demo!"
    And the log of container "app" of pod "env-demo" says "user admin"
    And the log of container "app" of pod "env-demo" says "color blue"
    And no report, log or call carries a secret value

  Scenario: A Secret that is not there fails the container until it is created
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: waits-for-secret, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers:
        - name: app
          image: busybox
          env: [{name: TOKEN, valueFrom: {secretKeyRef: {name: later, key: token}}}]
      """
    When the simulation runs
    Then pod "waits-for-secret" has a Warning "Failed" event saying "Error: secret "later" not found"
    And container "app" of pod "waits-for-secret" waits with reason "CreateContainerConfigError"
    And pod "waits-for-secret" is Pending
    When these manifests are applied:
      """
      apiVersion: v1
      kind: Secret
      metadata: {name: later}
      stringData: {token: abc}
      """
    Then pod "waits-for-secret" becomes Running

  Scenario: A key the Secret or ConfigMap does not have names the object
    Given the manifests:
      """
      apiVersion: v1
      kind: Secret
      metadata: {name: creds}
      stringData: {username: admin}
      ---
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: settings}
      data: {greeting: hello}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: bad-secret-key, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers:
        - {name: app, image: busybox, env: [{name: P, valueFrom: {secretKeyRef: {name: creds, key: nope}}}]}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: bad-config-key, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers:
        - {name: app, image: busybox, envFrom: [{configMapRef: {name: gone}}]}
      """
    When the simulation runs
    Then pod "bad-secret-key" has a Warning "Failed" event saying "Error: couldn't find key nope in Secret default/creds"
    And pod "bad-config-key" has a Warning "Failed" event saying "Error: configmap "gone" not found"

  Scenario: References that would loop expand once, as upstream's expansion does
    A `$(VAR)` is replaced by the value the variable had when it was defined, never expanded again
    (`third_party/forked/golang/expansion`), so a variable that names itself, or two that name each other,
    end as text rather than looping; `$$` escapes a reference.
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: loops, annotations: {inlet.dev/expected-phase: Succeeded}}
      spec:
        restartPolicy: Never
        containers:
        - name: app
          image: busybox
          env:
          - {name: SELF, value: "$(SELF)!"}
          - {name: A, value: "$(B)a"}
          - {name: B, value: "$(A)b"}
          - {name: ESCAPED, value: "$$(A)"}
          command: [echo, "$(SELF)", "$(A)", "$(B)", "$(ESCAPED)"]
      """
    When the simulation runs
    Then pod "loops" ends Succeeded
    And the log of container "app" of pod "loops" says "$(SELF)! $(B)a $(B)ab $(A)"

  Scenario: A subPathExpr is expanded with the container's variables, and refused when it steps out
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: per-pod, annotations: {inlet.dev/expected-phase: Succeeded}}
      spec:
        restartPolicy: Never
        containers:
        - name: writer
          image: busybox
          command: [sh, -c, "echo ok"]
          env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
          volumeMounts: [{name: data, mountPath: /mine, subPathExpr: "logs/$(POD_NAME)"}]
        - name: reader
          image: busybox
          command: [sh, -c, "test -d /all/logs/per-pod && echo the pod has its own dir"]
          volumeMounts: [{name: data, mountPath: /all}]
        volumes: [{name: data, emptyDir: {}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: escapes, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers:
        - name: app
          image: busybox
          env: [{name: UP, value: ".."}]
          volumeMounts: [{name: data, mountPath: /x, subPathExpr: "$(UP)/etc"}]
        volumes: [{name: data, emptyDir: {}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: unset, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers:
        - name: app
          image: busybox
          volumeMounts: [{name: data, mountPath: /x, subPathExpr: "$(NOPE)"}]
        volumes: [{name: data, emptyDir: {}}]
      """
    When the simulation runs
    Then pod "per-pod" ends Succeeded
    And the log of container "reader" of pod "per-pod" says "the pod has its own dir"
    And pod "escapes" has a Warning "Failed" event saying "Error: unable to provision SubPath `../etc`: must not contain '..'"
    And pod "unset" has a Warning "Failed" event saying "Error: missing value for NOPE"
    When all pods are deleted
    Then nothing is left on the node
