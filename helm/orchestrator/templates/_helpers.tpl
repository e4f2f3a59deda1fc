{{/* Names and labels. */}}
{{- define "orchestrator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The job's name: RayCluster, RayJob and HeteroTrainingJob share it (KubeRay adds suffixes). */}}
{{- define "orchestrator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains (include "orchestrator.name" .) .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "orchestrator.name" .) | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "orchestrator.labels" -}}
app.kubernetes.io/name: {{ include "orchestrator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
orchestrator.io/job: {{ include "orchestrator.fullname" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Whether the chart renders the RayCluster itself (else the operator does, from a HeteroTrainingJob). */}}
{{- define "orchestrator.direct" -}}
{{- if and .Values.rayCluster.enabled (not (and .Values.operator.enabled .Values.operator.createJob)) -}}true{{- end -}}
{{- end -}}

{{- define "orchestrator.metricsPort" -}}
{{- $metrics := .Values.job.metrics | default dict -}}
{{- $metrics.port | default 9400 -}}
{{- end -}}

{{/* The nvidia.com/gpu.product of a pool: its gpuProduct, else the table entry of its device type. */}}
{{- define "orchestrator.gpuProduct" -}}
{{- $pool := .pool -}}
{{- $product := $pool.gpuProduct | default (get .root.Values.gpuProducts $pool.deviceType) -}}
{{- if not $product -}}
{{- fail (printf "pools[%s].deviceType %q has no entry in gpuProducts; set pools[].gpuProduct or add it to gpuProducts" $pool.name $pool.deviceType) -}}
{{- end -}}
{{- $product -}}
{{- end -}}

{{/* Checks a schema cannot express. */}}
{{- define "orchestrator.validate" -}}
{{- $checkpoint := .Values.job.checkpoint | default dict -}}
{{- with $checkpoint.dir -}}
{{- $dir := . -}}
{{- $mounts := list -}}
{{- if $.Values.storage.claimName -}}{{- $mounts = append $mounts $.Values.storage.mountPath -}}{{- end -}}
{{- range $.Values.pod.volumeMounts -}}{{- $mounts = append $mounts .mountPath -}}{{- end -}}
{{- $covered := false -}}
{{- range $mounts -}}
{{- if or (eq $dir .) (hasPrefix (printf "%s/" (trimSuffix "/" .)) $dir) -}}{{- $covered = true -}}{{- end -}}
{{- end -}}
{{- if not $covered -}}
{{- fail (printf "job.checkpoint.dir %q is on no shared volume, so a replaced pod could not read the checkpoints; set storage.claimName (a ReadWriteMany PersistentVolumeClaim mounted at storage.mountPath) or mount a volume there with pod.volumes and pod.volumeMounts" $dir) -}}
{{- end -}}
{{- end -}}
{{- $names := list -}}
{{- range .Values.pools -}}
{{- if has .name $names -}}
{{- fail (printf "pools: name %q appears twice; pool names must be unique" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- $min := .minReplicas | default 0 | int -}}
{{- if gt $min (.maxReplicas | int) -}}
{{- fail (printf "pools[%s]: minReplicas (%d) > maxReplicas (%d); lower minReplicas or raise maxReplicas" .name $min (.maxReplicas | int)) -}}
{{- end -}}
{{- if and (hasKey . "replicas") (or (lt (.replicas | int) $min) (gt (.replicas | int) (.maxReplicas | int))) -}}
{{- fail (printf "pools[%s]: replicas (%d) outside [minReplicas, maxReplicas] = [%d, %d]" .name (.replicas | int) $min (.maxReplicas | int)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "orchestrator.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 1000
fsGroup: 100
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "orchestrator.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: {{ .Values.ray.readOnlyRootFilesystem }}
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The Secret holding the node-events token (operator -> controller). */}}
{{- define "orchestrator.tokenSecret" -}}
{{- printf "%s-node-events" (include "orchestrator.fullname" .) -}}
{{- end -}}

{{- define "orchestrator.tokenDir" -}}/var/run/orchestrator/node-events{{- end -}}

{{/* A hash of everything the job's pods run: a change re-submits the RayJob (new name). */}}
{{- define "orchestrator.checksum" -}}
{{- $inputs := dict "job" .Values.job "pools" .Values.pools "image" .Values.image "head" .Values.head "pod" .Values.pod "storage" .Values.storage "rayVersion" .Values.rayVersion "gpuProducts" .Values.gpuProducts "serviceAccount" .Values.serviceAccount "imagePullSecrets" .Values.imagePullSecrets -}}
{{- toJson $inputs | sha256sum | trunc 10 -}}
{{- end -}}

{{/* Volumes of every Ray pod: the job file, the places Ray writes (/tmp, /dev/shm), the shared
     checkpoint storage and the user's own volumes. */}}
{{- define "orchestrator.volumes" -}}
- name: job
  configMap:
    name: {{ include "orchestrator.fullname" . }}-job
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.pod.tmpSize | quote }}
- name: shm
  emptyDir:
    medium: Memory
{{- with .Values.storage.claimName }}
- name: storage
  persistentVolumeClaim:
    claimName: {{ . }}
{{- end }}
{{- with .Values.pod.volumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "orchestrator.volumeMounts" -}}
- name: job
  mountPath: /etc/orchestrator
  readOnly: true
- name: tmp
  mountPath: /tmp
- name: shm
  mountPath: /dev/shm
{{- if .Values.storage.claimName }}
- name: storage
  mountPath: {{ .Values.storage.mountPath }}
{{- end }}
{{- with .Values.pod.volumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Environment of every Ray container: the Kubernetes Node name, and from it the Ray node label
     orchestrator.io/node-name (Ray reads RAY_OVERRIDE_LABELS at `ray start`; Kubernetes expands
     $(K8S_NODE_NAME) because it is defined above it). The operator names Nodes by that label. */}}
{{- define "orchestrator.env" -}}
- name: HOME
  value: /tmp/home
- name: K8S_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: RAY_OVERRIDE_LABELS
  value: '{"orchestrator.io/node-name": "$(K8S_NODE_NAME)"}'
{{- with .Values.pod.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Pod-level settings shared by every Ray pod. */}}
{{- define "orchestrator.podSettings" -}}
automountServiceAccountToken: false
{{- with .Values.serviceAccount.name }}
serviceAccountName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.pod.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.pod.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
securityContext:
  {{- include "orchestrator.podSecurityContext" . | nindent 2 }}
{{- end -}}

{{/* Labels and annotations of every Ray pod. Cluster autoscaler must not evict a Ray pod to
     pack nodes: the operator moves work off a node first. */}}
{{- define "orchestrator.podMetadata" -}}
{{- $root := .root -}}
labels:
  {{- include "orchestrator.labels" $root | nindent 2 }}
  {{- with .extra }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with $root.Values.pod.labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  cluster-autoscaler.kubernetes.io/safe-to-evict: "false"
  orchestrator.io/checksum: {{ include "orchestrator.checksum" $root | quote }}
  {{- with $root.Values.pod.annotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* repository:tag, or repository@sha256:... when a digest pins the image. */}}
{{- define "orchestrator.image" -}}
{{- if .digest -}}
{{ printf "%s@%s" .repository .digest }}
{{- else -}}
{{ printf "%s:%s" .repository .tag }}
{{- end -}}
{{- end -}}

{{/* The RayCluster spec: one head group (the run's controller, no GPU) and one worker group per
     GPU pool. Rendered as a RayCluster of its own or inside the RayJob. */}}
{{- define "orchestrator.clusterSpec" -}}
{{- $root := . -}}
{{- $image := include "orchestrator.image" .Values.image -}}
rayVersion: {{ .Values.rayVersion | quote }}
headGroupSpec:
  rayStartParams:
    # No training on the head.
    num-cpus: "0"
    dashboard-host: "0.0.0.0"
  template:
    metadata:
      {{- include "orchestrator.podMetadata" (dict "root" . "extra" dict) | nindent 6 }}
    spec:
      {{- include "orchestrator.podSettings" . | nindent 6 }}
      {{- with .Values.pod.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: ray-head
          image: {{ $image }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          env:
            {{- include "orchestrator.env" . | nindent 12 }}
            - name: ORCHESTRATOR_NODE_EVENTS_TOKEN_FILE
              value: {{ include "orchestrator.tokenDir" . }}/token
          {{- with .Values.pod.envFrom }}
          envFrom:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          ports:
            - {name: gcs, containerPort: 6379}
            - {name: dashboard, containerPort: 8265}
            - {name: client, containerPort: 10001}
            - {name: metrics, containerPort: 8080}
            - name: orch-metrics
              containerPort: {{ include "orchestrator.metricsPort" . }}
          resources:
            requests: {cpu: {{ .Values.head.cpu | quote }}, memory: {{ .Values.head.memory | quote }}, ephemeral-storage: {{ .Values.pod.tmpSize | quote }}}
            limits: {cpu: {{ .Values.head.cpu | quote }}, memory: {{ .Values.head.memory | quote }}}
          securityContext:
            {{- include "orchestrator.containerSecurityContext" . | nindent 12 }}
          volumeMounts:
            {{- include "orchestrator.volumeMounts" . | nindent 12 }}
            - name: node-events-token
              mountPath: {{ include "orchestrator.tokenDir" . }}
              readOnly: true
      volumes:
        {{- include "orchestrator.volumes" . | nindent 8 }}
        - name: node-events-token
          secret:
            secretName: {{ include "orchestrator.tokenSecret" . }}
workerGroupSpecs:
  {{- range .Values.pools }}
  {{- $min := .minReplicas | default 0 | int }}
  - groupName: {{ .name }}
    replicas: {{ if hasKey . "replicas" }}{{ .replicas | int }}{{ else }}{{ $min }}{{ end }}
    minReplicas: {{ $min }}
    maxReplicas: {{ .maxReplicas | int }}
    # Ray node labels: the planner reads the device type from orchestrator.io/device-type (the
    # Node name, orchestrator.io/node-name, comes from the pod's environment).
    labels:
      orchestrator.io/device-type: {{ .deviceType | quote }}
      ray.io/accelerator-type: {{ .deviceType | quote }}
    rayStartParams: {}
    template:
      metadata:
        {{- include "orchestrator.podMetadata" (dict "root" $root "extra" (dict "orchestrator.io/pool" .name)) | nindent 8 }}
      spec:
        {{- include "orchestrator.podSettings" $root | nindent 8 }}
        nodeSelector:
          {{- with .nodeSelector }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
          nvidia.com/gpu.product: {{ include "orchestrator.gpuProduct" (dict "root" $root "pool" .) | quote }}
        {{- $tolerations := concat ($root.Values.pod.tolerations | default list) (.tolerations | default list) }}
        tolerations: {{ if $tolerations }}{{ toYaml $tolerations | nindent 10 }}{{ else }}[]{{ end }}
        containers:
          - name: ray-worker
            image: {{ $image }}
            imagePullPolicy: {{ $root.Values.image.pullPolicy }}
            env:
              {{- include "orchestrator.env" $root | nindent 14 }}
            {{- with $root.Values.pod.envFrom }}
            envFrom:
              {{- toYaml . | nindent 14 }}
            {{- end }}
            resources:
              requests:
                cpu: {{ .cpu | default "4" | quote }}
                memory: {{ .memory | default "16Gi" | quote }}
                ephemeral-storage: {{ $root.Values.pod.tmpSize | quote }}
              limits:
                cpu: {{ .cpu | default "4" | quote }}
                memory: {{ .memory | default "16Gi" | quote }}
                nvidia.com/gpu: {{ .gpusPerPod | default 1 | int }}
            securityContext:
              {{- include "orchestrator.containerSecurityContext" $root | nindent 14 }}
            volumeMounts:
              {{- include "orchestrator.volumeMounts" $root | nindent 14 }}
        volumes:
          {{- include "orchestrator.volumes" $root | nindent 10 }}
  {{- end }}
{{- end -}}
