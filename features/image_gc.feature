Feature: Image garbage collection counts image volumes as in use
  The kubelet's image GC (`image_gc_manager.go`) removes images no container uses: those unused for longer
  than `--image-maximum-gc-age`, and, above `--image-gc-high-threshold`, the least recently used down to
  the low threshold. Since 1.33 an image a container mounts as an image volume (CRI `Mount.image`) is in
  use; kubelet-sim also counts the images its engines' image volumes hold (the kubelet-side in-tree mount and
  the node's image drivers), which a real kubelet cannot see. After a collection the pull records of images
  that are gone are pruned (`PruneUnknownRecords`).

  Background:
    Given an image "example.inlet.dev/site:v1" with files:
      | path       | content        |
      | index.html | <h1>hello</h1> |
    And an image "example.inlet.dev/tools:v1" with files:
      | path       | content |
      | bin/tool   | tool    |
    And an image "example.inlet.dev/runtime-mounted:v1" with files:
      | path       | content |
      | data.txt   | data    |
    And an image "example.inlet.dev/unused:v1" with files:
      | path       | content |
      | junk.txt   | junk    |
    And the image driver "image.inlet.dev"
    And a CSIDriver "image.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      """
    And the image garbage collector removes images unused for 300 ms, and none for space

  Scenario: Images of in-tree and CSI image volumes stay; images no one uses go
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}, {name: tools, mountPath: /tools}]}]
        volumes:
        - {name: site, image: {reference: example.inlet.dev/site:v1, pullPolicy: Always}}
        - {name: tools, csi: {driver: image.inlet.dev, readOnly: true, volumeAttributes: {image: example.inlet.dev/tools:v1}}}
      """
    When the simulation runs
    Then pod "web" is Running
    When the image garbage collector of node "node-1" runs after 400 ms
    Then it removed images "example.inlet.dev/runtime-mounted:v1" and "example.inlet.dev/unused:v1", and no other
    And the runtime has images "example.inlet.dev/site:v1", "example.inlet.dev/tools:v1" and "busybox"
    And kubelet_image_garbage_collected_total{reason="age"} is at least 2
    And node "node-1" has a pulled-image record of image "example.inlet.dev/site:v1"

  Scenario: An image the runtime mounts for a container is in use through the container's status
    Given image volumes are mounted by the runtime
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, image: {reference: example.inlet.dev/runtime-mounted:v1}}]
      """
    When the simulation runs
    Then pod "web" is Running
    When the image garbage collector of node "node-1" runs after 400 ms
    Then it removed images "example.inlet.dev/site:v1", "example.inlet.dev/tools:v1" and "example.inlet.dev/unused:v1", and no other
    And the runtime has images "example.inlet.dev/runtime-mounted:v1" and "busybox"

  Scenario: Once the pod is gone, its images are collected, and the pull record of the volume's image pruned
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1, pullPolicy: Always}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And node "node-1" has a pulled-image record of image "example.inlet.dev/site:v1"
    When pod "web" is deleted
    When the image garbage collector of node "node-1" runs after 1100 ms
    Then it removed images "busybox", "example.inlet.dev/site:v1", "example.inlet.dev/tools:v1", "example.inlet.dev/runtime-mounted:v1" and "example.inlet.dev/unused:v1", and no other
    And node "node-1" has no pulled-image record of image "example.inlet.dev/site:v1"
