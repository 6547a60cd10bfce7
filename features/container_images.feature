Feature: Container images at every start
  Each start of a container, the first and every restart, begins with its image per its pull policy
  (`kuberuntime_container.go` startContainer, step 1, through `image_manager.go` EnsureImageExists), in the
  pod's sandbox, which exists before any pull. A failed pull leaves the container waiting with
  `ErrImagePull`, then `ImagePullBackOff` while the pod's back-off for that image runs (10 s doubling to
  5 min upstream, keyed by pod and image), with the failure in the message; the pod's other containers
  start meanwhile.

  Scenario: A pull that fails is ErrImagePull, then ImagePullBackOff, while the pod's other container runs
    Given an image "example.inlet.dev/app:v1" with files:
      | path       | content |
      | index.html | hello   |
    And the runtime fails PullImage with NotFound
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: two-images, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers:
        - {name: app, image: example.inlet.dev/app:v1, imagePullPolicy: IfNotPresent, command: [sleep, "3600"]}
        - {name: helper, image: example.inlet.dev/missing:v1, imagePullPolicy: IfNotPresent}
      """
    When the simulation runs
    Then pod "two-images" has a Warning "Failed" event saying "Failed to pull image "example.inlet.dev/missing:v1": rpc error: code = NotFound desc = connection refused"
    And pod "two-images" has a Warning "Failed" event saying "Error: ErrImagePull"
    And pod "two-images" has a Normal "BackOff" event saying "Back-off pulling image "example.inlet.dev/missing:v1""
    And pod "two-images" has a Warning "Failed" event saying "Error: ImagePullBackOff"
    And the API status of container "helper" of pod "two-images" waits with reason "ImagePullBackOff" and a message starting "Back-off pulling image "example.inlet.dev/missing:v1": ErrImagePull: rpc error: code = NotFound"
    And the API status of container "app" of pod "two-images" runs with a containerID starting "cri-fake://" and an imageID
    And pod "two-images" is Pending
    When all pods are deleted
    Then nothing is left on the node

  Scenario: Every restart pulls again under Always, and a pull says how long it took and how large it is
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: always}
      spec:
        containers: [{name: app, image: busybox, imagePullPolicy: Always, command: [sh, -c, "exit 1"]}]
      """
    When the simulation runs
    Then container "app" of pod "always" is restarted at least 2 times
    And pod "always" has had at least 3 "Pulling" events
    And pod "always" has a Normal "Pulled" event saying "Successfully pulled image "busybox" in "
    And pod "always" has a Normal "Pulled" event saying " including waiting). Image size: "
