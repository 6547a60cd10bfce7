Feature: Ephemeral inline CSI volumes (KEP-596)
  An inline csi volume in a pod is created by the driver when the pod starts and deleted when it goes.
  The kubelet calls only NodePublishVolume and NodeUnpublishVolume, with a handle it derives itself.

  Background:
    Given the local driver "local.inlet.dev"
    And a CSIDriver "local.inlet.dev" with:
      """
      volumeLifecycleModes: [Ephemeral]
      podInfoOnMount: true
      """

  Scenario: The volume handle is csi- and the sha256 of the pod UID and the volume name
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: scratch, mountPath: /scratch}]}]
        volumes: [{name: scratch, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And the volume id of "scratch" in pod "web" is csi- and the sha256 of the pod UID and the volume name
    And the vol_data.json of "scratch" in pod "web" records mode "Ephemeral" and driver "local.inlet.dev"

  Scenario: Only NodePublishVolume and NodeUnpublishVolume are called: no attach, no staging
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: scratch, mountPath: /scratch}]}]
        volumes: [{name: scratch, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    And all pods are deleted
    Then the driver got NodePublishVolume for volume "scratch" of pod "web"
    And the driver got NodeUnpublishVolume for volume "scratch" of pod "web"
    And the publish of "scratch" in pod "web" has the staging path empty
    And the driver got no NodeStageVolume call
    And the driver got no ControllerPublishVolume call
    And there are 0 VolumeAttachments
    And nothing is left on the node

  Scenario: A user-supplied volumeHandle is ignored for an ephemeral volume
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: scratch, mountPath: /scratch}]}]
        volumes: [{name: scratch, csi: {driver: local.inlet.dev, volumeHandle: chosen-by-user}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And the volume id of "scratch" in pod "web" is csi- and the sha256 of the pod UID and the volume name

  Scenario: should create read-only inline ephemeral volume
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: reader}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /mnt/test, readOnly: true}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "reader" is Running
    And container "app" of pod "reader" mounts "/mnt/test" read-only
    And the publish of "data" in pod "reader" is read-write

  Scenario: csi.readOnly makes NodePublishVolume read-only and the container mount read-only
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: reader}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /mnt/test}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, readOnly: true}}]
      """
    When the simulation runs
    Then pod "reader" is Running
    And the publish of "data" in pod "reader" is read-only
    And container "app" of pod "reader" mounts "/mnt/test" read-only

  Scenario: should create read/write inline ephemeral volume
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: writer}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /mnt/test}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "writer" is Running
    And container "app" of pod "writer" mounts "/mnt/test" read-write
    And the publish of "data" in pod "writer" is read-write

  Scenario: should support two pods which have the same volume definition
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: inline-volume-tester}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: my-volume-0, mountPath: /mnt/test-0}]}]
        volumes: [{name: my-volume-0, csi: {driver: local.inlet.dev, volumeAttributes: {size: 8Mi}}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: inline-volume-tester2}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: my-volume-0, mountPath: /mnt/test-0}]}]
        volumes: [{name: my-volume-0, csi: {driver: local.inlet.dev, volumeAttributes: {size: 8Mi}}}]
      """
    When the simulation runs
    Then pod "inline-volume-tester" is Running
    And pod "inline-volume-tester2" is Running
    And pods "inline-volume-tester" and "inline-volume-tester2" got different volume ids for "my-volume-0"

  Scenario: should support multiple inline ephemeral volumes
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: multi}
      spec:
        containers:
          - name: app
            image: busybox
            volumeMounts: [{name: my-volume-0, mountPath: /mnt/test-0}, {name: my-volume-1, mountPath: /mnt/test-1}]
        volumes:
          - {name: my-volume-0, csi: {driver: local.inlet.dev}}
          - {name: my-volume-1, csi: {driver: local.inlet.dev}}
      """
    When the simulation runs
    Then pod "multi" is Running
    And the driver got NodePublishVolume for volume "my-volume-0" of pod "multi"
    And the driver got NodePublishVolume for volume "my-volume-1" of pod "multi"
    And container "app" of pod "multi" mounts "/mnt/test-1" read-write

  Scenario: Deleting the pod unpublishes and deletes its volumes, leaving nothing behind
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: a, mountPath: /a}, {name: b, mountPath: /b, subPath: sub}]}]
        volumes: [{name: a, csi: {driver: local.inlet.dev}}, {name: b, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    And all pods are deleted
    Then the driver got NodeUnpublishVolume for volume "a" of pod "web"
    And the driver got NodeUnpublishVolume for volume "b" of pod "web"
    And nothing is left on the node

  @mounts
  Scenario: A failed NodeUnpublishVolume leaves the mount uncertain and is retried, with no pod event
    Upstream's UnmountVolume marks the mount uncertain when TearDown fails and retries it with back-off;
    its event recorder is nil there, so the pod gets no event (operation_generator.go). A file held open in
    the volume makes the driver's unmount fail with EBUSY until it is let go.
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "web" is Running
    When a process holds "/data:busy.txt" open in pod "web"
    And pod "web" is being deleted
    Then the driver got NodeUnpublishVolume for volume "data" of pod "web" at least 2 times
    When the process lets go of its files
    Then nothing is left of pod "web" on "node-1"
    And pod "web" got no Warning event

  Scenario: A driver error reaches the pod as a FailedMount event in upstream's form
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: bad-size}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev, volumeAttributes: {size: lots}}}]
      """
    When the simulation runs
    Then pod "bad-size" is Pending
    And pod "bad-size" has a Warning "FailedMount" event saying "MountVolume.SetUp failed for volume "data" : rpc error: code = InvalidArgument desc = volume_context["size"]"
