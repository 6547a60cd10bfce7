Feature: subPath: the kubelet binds it, without following symlinks, and removes the bind before teardown
  A volumeMount with a subPath is never handed to the runtime as a path inside the volume. The kubelet opens
  the subPath one component at a time without following symlinks, bind-mounts what it opened onto
  pods/<uid>/volume-subpaths/<volume>/<container>/<index>, and gives the runtime that bind
  (pkg/volume/util/subpath/subpath_linux.go, doBindSubPath); the index counts every volumeMount of the
  container. A subPath that leads out of its volume is refused with upstream's text, which names no host path
  (kubelet_pods.go, makeMounts), and the container waits in CreateContainerConfigError. The binds are removed
  before the volume is torn down (CleanSubPaths).

  Background:
    Given a CSIDriver "local.inlet.dev" with:
      """
      attachRequired: false
      podInfoOnMount: true
      volumeLifecycleModes: [Ephemeral, Persistent]
      """
    And the local driver "local.inlet.dev"

  Scenario: The runtime gets the subPath's bind under volume-subpaths, and the bind goes before the volume
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: web}
      spec:
        containers:
        - name: app
          image: busybox
          volumeMounts: [{name: data, mountPath: /data}, {name: data, mountPath: /logs, subPath: logs/app}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "web" is Running
    And container "app" of pod "web" mounts "/logs" from its pod's "volume-subpaths/data/app/1"
    And container "app" of pod "web" mounts "/logs" read-write
    When pod "web" writes "started" to "/logs:app.log"
    Then pod "web" reads "started" at "/data:logs/app/app.log"
    When all pods are deleted
    Then the driver got NodeUnpublishVolume for volume "data" of pod "web"
    And nothing is left on the node

  @mounts
  Scenario: A subPath that a pod turned into a symlink out of the volume is refused, naming no host path
    Given a CSIDriver "local.inlet.dev" with:
      """
      attachRequired: false
      volumeLifecycleModes: [Persistent]
      """
    And the manifests:
      """
      apiVersion: v1
      kind: PersistentVolume
      metadata: {name: shared}
      spec:
        capacity: {storage: 16Mi}
        accessModes: [ReadWriteOnce]
        csi: {driver: local.inlet.dev, volumeHandle: shared}
        claimRef: {namespace: default, name: shared}
      ---
      apiVersion: v1
      kind: PersistentVolumeClaim
      metadata: {name: shared}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: writer}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: shared}}]
      """
    When the simulation runs
    Then pod "writer" is Running
    When pod "writer" makes "/data:escape" a symlink to "/etc"
    And these manifests are applied:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: reader}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /etc/host, subPath: escape}]}]
        volumes: [{name: data, persistentVolumeClaim: {claimName: shared}}]
      """
    Then pod "reader" has a Warning "Failed" event saying "Error: failed to prepare subPath for volumeMount "data" of container "app""
    And pod "reader" is Pending
    And container "app" of pod "reader" waits with reason "CreateContainerConfigError"
    When all pods are deleted
    Then nothing is left on the node

  Scenario: An absolute subPath or one with '..' is refused with upstream's texts
    Given the manifests:
      """
      apiVersion: v1
      kind: Pod
      metadata: {name: absolute}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data, subPath: /etc}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      ---
      apiVersion: v1
      kind: Pod
      metadata: {name: backsteps}
      spec:
        containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data, subPath: a/../../b}]}]
        volumes: [{name: data, csi: {driver: local.inlet.dev}}]
      """
    When the simulation runs
    Then pod "absolute" has a Warning "Failed" event saying "Error: error SubPath `/etc` must not be an absolute path"
    And pod "backsteps" has a Warning "Failed" event saying "Error: unable to provision SubPath `a/../../b`: must not contain '..'"
    And pod "absolute" is Pending
