Feature: Secret and emptyDir volumes beside CSI ones
  A real cluster's pods carry volumes besides CSI ones: up to Kubernetes 1.20 the API server gives every pod
  its service account's token as a `secret` volume, and pods ask for `emptyDir` scratch space. A node sets
  them up as the kubelet's plugins do (`pkg/volume/secret`, `pkg/volume/emptydir`): a Secret's keys as
  files with their modes on a tmpfs, so the values never reach the node's disk; an emptyDir as a
  directory any container user may write, on a tmpfs for `medium: Memory`; nothing left after the pod.

  Scenario: A secret volume holds the chosen keys with their modes on a tmpfs, and emptyDirs are writable
    Given the manifests:
      """
      apiVersion: v1
      kind: Secret
      metadata: {name: token}
      stringData: {token: s3cr3t-password, ca.crt: a-certificate}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers:
        - name: app
          image: busybox
          volumeMounts:
          - {name: token, mountPath: /var/run/secrets}
          - {name: scratch, mountPath: /scratch}
          - {name: fast, mountPath: /fast}
        volumes:
        - {name: token, secret: {secretName: token, items: [{key: token, path: sub/token, mode: 256}]}}
        - {name: scratch, emptyDir: {}}
        - {name: fast, emptyDir: {medium: Memory}}
      """
    When the simulation runs
    Then pod "web" is Running
    And pod "web" reads "s3cr3t-password" at "/var/run/secrets:sub/token"
    And the file "/var/run/secrets:sub/token" of pod "web" has mode 400
    And pod "web" finds no "/var/run/secrets:ca.crt"
    And "/var/run/secrets" of pod "web" is on a tmpfs
    And "/fast" of pod "web" is on a tmpfs
    And the file "/scratch:." of pod "web" has mode 777
    When pod "web" writes "notes" to "/scratch:notes.txt"
    Then pod "web" reads "notes" at "/scratch:notes.txt"
    And no report, log or call carries a secret value
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A pod whose secret volume names a missing Secret waits, and starts once it exists
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: creds, mountPath: /creds}]}]
        volumes: [{name: creds, secret: {secretName: later}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "creds" : secret "later" not found"
    When these manifests are applied:
      """
      apiVersion: v1
      kind: Secret
      metadata: {name: later}
      stringData: {password: s3cr3t-password}
      """
    Then pod "web" becomes Running
    And pod "web" reads "s3cr3t-password" at "/creds:password"
    When all pods are deleted
    Then nothing is left on the node
