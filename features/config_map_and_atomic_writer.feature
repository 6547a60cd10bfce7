Feature: Secret and configMap volumes written as AtomicWriter writes them
  The kubelet projects a Secret's or ConfigMap's keys into a volume so that a reader sees one version whole
  (`pkg/volume/util/atomic_writer.go`): the files live in a hidden timestamped directory, `..data` links
  to it, and each name the pod sees links through `..data`; an update writes a new directory and swaps
  `..data` with one rename, then removes the old one. Both volumes are mounted read-only, and given to the
  pod's fsGroup (`SetVolumeOwnership`) before a version becomes visible. A memory-backed emptyDir's tmpfs is
  the node's allocatable memory, or the pod's memory limit, or its `sizeLimit`, whichever is least
  (`calculateEmptyDirMemorySize`).

  Scenario: A configMap volume links each key through ..data, and an update swaps the whole set
    Given the manifests:
      """
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: app-config}
      data: {app.yaml: "level: info", extra: "1"}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        securityContext: {fsGroup: 4242}
        containers:
        - name: app
          image: busybox
          command: [sleep, "3600"]
          volumeMounts: [{name: config, mountPath: /config}]
        volumes: [{name: config, configMap: {name: app-config, defaultMode: 416}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And pod "web" reads "level: info" at "/config:app.yaml"
    And "/config:app.yaml" of pod "web" links to "..data/app.yaml"
    And "/config:..data" of pod "web" links to its one timestamped directory
    And the file "/config:..data/app.yaml" of pod "web" has mode 640
    And the file "/config:..data/app.yaml" of pod "web" has group 4242
    And container "app" of pod "web" mounts "/config" read-only
    When these manifests are applied:
      """
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: app-config}
      data: {app.yaml: "level: debug"}
      """
    Then pod "web" comes to read "level: debug" at "/config:app.yaml"
    And "/config:..data" of pod "web" links to its one timestamped directory
    And pod "web" finds no "/config:extra"
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A missing configMap key fails the mount with upstream's text; an optional one is skipped
    Given the manifests:
      """
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: app-config}
      data: {app.yaml: "level: info"}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: strict, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: config, mountPath: /config}]}]
        volumes: [{name: config, configMap: {name: app-config, items: [{key: missing, path: m}]}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: lenient}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: config, mountPath: /config}]}]
        volumes: [{name: config, configMap: {name: app-config, optional: true, items: [{key: missing, path: m}]}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: absent, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: config, mountPath: /config}]}]
        volumes: [{name: config, configMap: {name: nowhere}}]
      """
    When the simulation runs
    Then pod "strict" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "config" : configmap references non-existent config key: missing"
    And pod "absent" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "config" : configmap "nowhere" not found"
    And pod "lenient" is Running
    And pod "lenient" finds no "/config:m"
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A secret volume is given to the fsGroup, read-only
    Given the manifests:
      """
      apiVersion: v1
      kind: Secret
      metadata: {name: token}
      stringData: {token: s3cr3t-password}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        securityContext: {fsGroup: 4243}
        containers: [{name: app, image: busybox, volumeMounts: [{name: token, mountPath: /token}]}]
        volumes: [{name: token, secret: {secretName: token}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And "/token:token" of pod "web" links to "..data/token"
    And the file "/token:..data/token" of pod "web" has group 4243
    And the file "/token:..data/token" of pod "web" has mode 644
    And container "app" of pod "web" mounts "/token" read-only
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A memory-backed emptyDir is no larger than the pod's memory limit or its sizeLimit
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers:
        - name: app
          image: busybox
          resources: {limits: {memory: 64Mi}}
          volumeMounts: [{name: pod-sized, mountPath: /pod-sized}, {name: small, mountPath: /small}, {name: large, mountPath: /large}]
        volumes:
        - {name: pod-sized, emptyDir: {medium: Memory}}
        - {name: small, emptyDir: {medium: Memory, sizeLimit: 16Mi}}
        - {name: large, emptyDir: {medium: Memory, sizeLimit: 1Gi}}
      """
    When the simulation runs
    Then pod "web" is Running
    And "/pod-sized" of pod "web" is a tmpfs of 64 MiB
    And "/small" of pod "web" is a tmpfs of 16 MiB
    And "/large" of pod "web" is a tmpfs of 64 MiB
    When all pods are deleted
    Then nothing is left on the node
