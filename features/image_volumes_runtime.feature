Feature: Image volumes the runtime mounts (KEP-4639 through CRI)
  Upstream's kubelet pulls each `volumes[].image` through its image manager before the pod's containers start
  (`kuberuntime_manager.go` getImageVolumes) and hands it to the runtime as a CRI `Mount` with `image` set,
  and a subPath as `image_sub_path` (1.33); CRI-O 1.31+ and containerd 2.1+ mount it, and CRI-O 1.33+ and
  containerd 2.2+ honour the sub path. kubelet-sim does the same with `--image-volume-mounts runtime` (and by
  default on those newer runtimes); cri-fake mounts the image's layers as they do. The kubelet-side mount
  (image_volumes.feature) stays for runtimes without it.

  Background:
    Given an image "example.inlet.dev/site:v1" with files:
      | path            | content                |
      | index.html      | <h1>hello</h1>         |
      | data/motd.txt   | from the first layer   |
      | (new layer)     |                        |
      | data/version.txt| v1                     |
    And image volumes are mounted by the runtime

  Scenario: The runtime mounts the image read-only; the kubelet mounts nothing
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web, annotations: {inlet.dev/expected-phase: Succeeded}}
      spec:
        restartPolicy: Never
        containers:
        - {name: app, image: busybox, command: [sh, -c, "cat /site/index.html /site/data/version.txt"], volumeMounts: [{name: site, mountPath: /site}]}
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1, pullPolicy: IfNotPresent}}]
      """
    When the simulation runs
    Then pod "web" ends Succeeded
    And container "app" of pod "web" has the runtime mount image "example.inlet.dev/site:v1" at "/site" read-only
    And the log of container "app" of pod "web" says "<h1>hello</h1>"
    And the log of container "app" of pod "web" says "v1"
    And node "node-1" holds 0 shared read-only image mounts
    And pod "web" has a Normal "Pulled" event saying "Container image "example.inlet.dev/site:v1" already present on machine"

  Scenario: A subPath is a path inside the image, handed to the runtime as image_sub_path
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web, annotations: {inlet.dev/expected-phase: Succeeded}}
      spec:
        restartPolicy: Never
        containers:
        - {name: app, image: busybox, command: [sh, -c, "cat /motd/motd.txt"], volumeMounts: [{name: site, mountPath: /motd, subPath: data}]}
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1}}]
      """
    When the simulation runs
    Then pod "web" ends Succeeded
    And the log of container "app" of pod "web" says "from the first layer"

  Scenario: A subPath missing from the image is the runtime's error, as the CRI asks
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /x, subPath: nope}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "Failed" event saying "ImageVolumeMountFailed"
    And the API status of container "app" of pod "web" waits with reason "CreateContainerError"
    And pod "web" is Pending

  Scenario: An image volume that cannot be pulled holds back only the containers that mount it
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers:
        - {name: app, image: busybox, volumeMounts: [{name: tools, mountPath: /tools}]}
        - {name: sidecar, image: busybox}
        volumes: [{name: tools, image: {reference: example.inlet.dev/absent:v1, pullPolicy: Never}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "ErrImageNeverPull" event saying "Container image "example.inlet.dev/absent:v1" is not present with pull policy of Never"
    And pod "web" has a Warning "Failed" event saying "Error: ErrImageNeverPull"
    And the API status of container "app" of pod "web" waits with reason "ErrImageNeverPull"
    And container "sidecar" of pod "web" is running

  Scenario: The image an image volume mounts cannot be removed while its container lives
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And the runtime refuses to remove image "example.inlet.dev/site:v1", saying "in use by container"
