Feature: Image volumes through CRI
  A container image's files mounted as a volume: pulled through the runtime's CRI (so its registry
  configuration applies), mounted from the runtime's own storage (containers/storage's layers here, as
  cri-fake keeps them), one shared read-only mount per image on a node, a copy-on-write layer per writable
  volume, nothing left behind.

  Background:
    Given an image "example.inlet.dev/site:v1" with files:
      | path            | content                |
      | index.html      | <h1>hello</h1>         |
      | data/motd.txt   | from the first layer   |
      | (new layer)     |                        |
      | data/version.txt| v1                     |
    And the image driver "image.inlet.dev"
    And a CSIDriver "image.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral, Persistent]
      podInfoOnMount: true
      fsGroupPolicy: None
      """

  Scenario: An in-tree image volume is mounted read-only with the image's files
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1, pullPolicy: IfNotPresent}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And container "app" of pod "web" mounts "/site" read-only
    And pod "web" reads "<h1>hello</h1>" at "/site:index.html"
    And pod "web" reads "v1" at "/site:data/version.txt"
    And pod "web" cannot write to "/site:new.txt"

  @mounts
  Scenario: A program in an image volume runs: the volume is read-only, not noexec
    KEP-4639 first asked runtimes for noexec image mounts; kubernetes/enhancements#5354 dropped that in 1.34
    (and kubernetes#135775 the API's words), so tools shipped as images can be run from their volumes.
    Given an image "example.inlet.dev/tools:v1" with files:
      | path               | content                                 |
      | (executable) bin/hello | #!/bin/sh\necho hello from the image |
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: tools}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: tools, mountPath: /tools}, {name: csi-tools, mountPath: /csi-tools}]}]
        volumes:
        - {name: tools, image: {reference: example.inlet.dev/tools:v1}}
        - {name: csi-tools, csi: {driver: image.inlet.dev, readOnly: true, volumeAttributes: {image: example.inlet.dev/tools:v1}}}
      """
    When the simulation runs
    Then pod "tools" is Running
    And pod "tools" runs "/tools:bin/hello", which prints "hello from the image"
    And pod "tools" runs "/csi-tools:bin/hello", which prints "hello from the image"

  @mounts
  Scenario: A subPath of an image volume mounts a directory of the image
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /motd, subPath: data}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And pod "web" reads "from the first layer" at "/motd:motd.txt"

  Scenario: A subPath missing from the image fails the container, as the CRI asks
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
    Then pod "web" has a Warning "Failed" event saying "does not exist in image volume"
    And pod "web" is Pending

  Scenario: Pods using the same image on a node share one read-only mount
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: a}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: b}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, image: {reference: example.inlet.dev/site:v1}}]
      """
    When the simulation runs
    Then pod "a" is Running
    And pod "b" is Running
    And node "node-1" holds 1 shared read-only image mount
    And pod "b" reads "<h1>hello</h1>" at "/site:index.html"
    When pod "a" is deleted
    Then node "node-1" holds 1 shared read-only image mount
    And pod "b" reads "<h1>hello</h1>" at "/site:index.html"
    When all pods are deleted
    Then node "node-1" holds 0 shared read-only image mounts
    And nothing is left on the node

  Scenario: Writable image volumes of two pods are isolated copies of one image
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: a}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, csi: {driver: image.inlet.dev, volumeAttributes: {image: example.inlet.dev/site:v1}}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: b}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, csi: {driver: image.inlet.dev, volumeAttributes: {image: example.inlet.dev/site:v1}}}]
      """
    When the simulation runs
    Then pod "a" is Running
    And pod "b" is Running
    And the publish of "site" in pod "a" is read-write
    When pod "a" writes "draft" to "/site:index.html"
    Then pod "a" reads "draft" at "/site:index.html"
    And pod "b" reads "<h1>hello</h1>" at "/site:index.html"
    When all pods are deleted
    Then the driver got NodeUnpublishVolume for volume "site" of pod "a"
    And nothing is left on the node

  @mounts
  Scenario: A writable image volume keeps what its pod wrote across a restart of kubelet, driver and runtime
    kubelet-sim restarts whole on the same root: the kubelet (which reconstructs the volume and publishes it
    again), the image driver (which finds its record and the copy-on-write layer) and cri-fake. What the pod
    wrote is still there; the volume ends with its pod. A node's reboot ends it too: its mounts are gone, so
    the driver's recovery forgets the volume and removes its layer (an image PV is read-only, with no layer).
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: editor, uid: 6b0c3c5e-0000-4000-8000-0000000000e1}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, csi: {driver: image.inlet.dev, volumeAttributes: {image: example.inlet.dev/site:v1}}}]
      """
    When the simulation runs
    Then pod "editor" is Running
    When pod "editor" writes "draft" to "/site:draft.html"
    And kubelet-sim restarts on the same root, its manifests applied 300 ms later
    Then pod "editor" is Running
    And pod "editor" reads "draft" at "/site:draft.html"
    And pod "editor" reads "<h1>hello</h1>" at "/site:index.html"
    When all pods are deleted
    Then nothing is left on the node

  @mounts
  Scenario: A writable image volume keeps what its pod wrote while the runtime is down and after it is back
    The runtime going away does not touch a published volume: its copy-on-write layer is the driver's, over
    the image's layers. Once the runtime is back, new volumes of the image are published as before.
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: editor}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, csi: {driver: image.inlet.dev, volumeAttributes: {image: example.inlet.dev/site:v1}}}]
      """
    When the simulation runs
    Then pod "editor" is Running
    When pod "editor" writes "draft" to "/site:draft.html"
    And the runtime stops
    Then pod "editor" reads "draft" at "/site:draft.html"
    When the runtime starts again
    And these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: reader}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, csi: {driver: image.inlet.dev, volumeAttributes: {image: example.inlet.dev/site:v1}}}]
      """
    Then pod "reader" is Running
    And pod "editor" is Running
    And pod "editor" reads "draft" at "/site:draft.html"
    And pod "reader" reads "<h1>hello</h1>" at "/site:index.html"
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A read-only inline CSI image volume shares the image's mount
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, csi: {driver: image.inlet.dev, readOnly: true, volumeAttributes: {image: example.inlet.dev/site:v1}}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And the publish of "site" in pod "web" is read-only
    And node "node-1" holds 1 shared read-only image mount
    And pod "web" cannot write to "/site:index.html"

  Scenario: An attribute the image driver does not know is refused, and read-only is the volume's readOnly
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, csi: {driver: image.inlet.dev, volumeAttributes: {image: example.inlet.dev/site:v1, readOnly: "true"}}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "FailedMount" event saying "code = InvalidArgument desc = volume_context["
    And pod "web" has a Warning "FailedMount" event saying "unknown attribute; the image driver accepts image, pullPolicy, pullAlways, metadata, artifact; a volume is made read-only by the volume source's readOnly: true"
    And pod "web" is Pending
    And the driver got no NodeUnpublishVolume calls

  Scenario: A PersistentVolume whose handle is the image is mounted read-only
    Given the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: site}
      spec:
        capacity: {storage: 1Gi}
        accessModes: [ReadOnlyMany]
        csi: {driver: image.inlet.dev, volumeHandle: "example.inlet.dev/site:v1"}
        claimRef: {namespace: default, name: site}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: site}
      spec: {accessModes: [ReadOnlyMany], volumeName: site, resources: {requests: {storage: 1Gi}}}
      status: {phase: Bound}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, persistentVolumeClaim: {claimName: site, readOnly: true}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And pod "web" reads "<h1>hello</h1>" at "/site:index.html"

  Scenario: A PersistentVolume of an image with a writable access mode is refused
    Given the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: site}
      spec:
        capacity: {storage: 1Gi}
        accessModes: [ReadWriteOnce]
        csi: {driver: image.inlet.dev, volumeHandle: "example.inlet.dev/site:v1"}
        claimRef: {namespace: default, name: site}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: site}
      spec: {accessModes: [ReadWriteOnce], volumeName: site, resources: {requests: {storage: 1Gi}}}
      status: {phase: Bound}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes: [{name: site, persistentVolumeClaim: {claimName: site}}]
      """
    When the simulation runs
    Then pod "web" has a Warning "FailedMount" event saying "AccessMode of PV can be only ReadOnlyMany or ReadOnlyOnce"
    And pod "web" is Pending

  Scenario: On request, the image's metadata is presented beside its files
    Given an image "example.inlet.dev/annotated:v1" with files:
      | path                             | content |
      | index.html                       | hello   |
      | (annotation) org.example.purpose | demo    |
    And the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: site, mountPath: /site}]}]
        volumes:
          - name: site
            csi: {driver: image.inlet.dev, readOnly: true, volumeAttributes: {image: example.inlet.dev/annotated:v1, metadata: "true"}}
      """
    When the simulation runs
    Then pod "web" is Running
    And pod "web" reads "hello" at "/site:index.html"
    And pod "web" reads "{"org.example.purpose":"demo"}" at "/site:.image-metadata/annotations.json"
    When all pods are deleted
    Then nothing is left on the node

  Scenario: A Block PV of the image driver, which serves no raw block, fails MapPodDevice with the driver's error
    The driver does not stage, so the kubelet goes straight to MapPodDevice (`csi_block.go`); the driver's
    INVALID_ARGUMENT reaches the pod as MapVolume's `FailedMapVolume` event, and nothing is left once the pod is gone.
    Given the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: site-blk}
      spec:
        capacity: {storage: 1Gi}
        accessModes: [ReadOnlyMany]
        volumeMode: Block
        csi: {driver: image.inlet.dev, volumeHandle: "example.inlet.dev/site:v1"}
        claimRef: {namespace: default, name: site-blk}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: site-blk}
      spec: {accessModes: [ReadOnlyMany], volumeMode: Block, volumeName: site-blk, resources: {requests: {storage: 1Gi}}}
      status: {phase: Bound}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: raw, annotations: {inlet.dev/expected-phase: Pending}}
      spec:
        containers: [{name: app, image: busybox, volumeDevices: [{name: site, devicePath: /dev/site}]}]
        volumes: [{name: site, persistentVolumeClaim: {claimName: site-blk, readOnly: true}}]
      """
    When the simulation runs
    Then pod "raw" has a Warning "FailedMapVolume" event saying "MapVolume.MapPodDevice failed for volume "site-blk" : rpc error: code = InvalidArgument desc = volume_capability: unable to mount as a block device: image volumes are filesystems"
    And pod "raw" is Pending
    When all pods are deleted
    Then nothing is left on the node
    And the kubelet dir of "node-1" holds nothing of "site-blk" under "plugins/kubernetes.io/csi/volumeDevices"
