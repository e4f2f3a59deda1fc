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

{{/* Volumes of every Ray pod: the job file, and the only places Ray writes (/tmp, /dev/shm). */}}
{{- define "orchestrator.volumes" -}}
- name: job
  configMap:
    name: {{ include "orchestrator.fullname" . }}-job
- name: tmp
  emptyDir: {}
- name: shm
  emptyDir:
    medium: Memory
{{- end -}}

{{- define "orchestrator.volumeMounts" -}}
- name: job
  mountPath: /etc/orchestrator
  readOnly: true
- name: tmp
  mountPath: /tmp
- name: shm
  mountPath: /dev/shm
{{- end -}}

{{- define "orchestrator.image" -}}
{{ printf "%s:%s" .repository .tag }}
{{- end -}}
