{{- define "dayzero.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dayzero.name" -}}
{{- printf "%s-%s" (include "dayzero.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The CPU image (API, runner, ingest, relay, workers, migrations). A digest wins over a tag. */}}
{{- define "dayzero.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The inference server's image: the GPU build (tag suffix -gpu) unless it runs without GPUs. */}}
{{- define "dayzero.inferenceImage" -}}
{{- $inf := .Values.inference -}}
{{- if eq (int $inf.gpus) 0 -}}
{{ include "dayzero.image" . }}
{{- else -}}
{{ $inf.image.repository | default .Values.image.repository }}:{{ $inf.image.tag | default (printf "%s-gpu" (.Values.image.tag | default .Chart.AppVersion)) }}
{{- end -}}
{{- end -}}

{{- define "dayzero.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dayzero.componentLabels" -}}
{{ include "dayzero.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dayzero.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dayzero.secretName" -}}
{{- .Values.secret.existingSecret | default (printf "%s-secrets" (include "dayzero.fullname" .)) -}}
{{- end -}}

{{- define "dayzero.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ .Values.serviceAccount.name | default (include "dayzero.fullname" .) }}
{{- else -}}
{{ .Values.serviceAccount.name | default "default" }}
{{- end -}}
{{- end -}}

{{- define "dayzero.inferenceUrl" -}}
{{- if .Values.inferenceUrl -}}
{{ .Values.inferenceUrl }}
{{- else if .Values.inference.enabled -}}
http://{{ include "dayzero.fullname" . }}-inference:{{ .Values.inference.port }}
{{- end -}}
{{- end -}}

{{/* Whether model calls carry DAYZERO_INFERENCE_API_KEY (always with the in-chart server). */}}
{{- define "dayzero.inferenceKey" -}}
{{- if or .Values.inference.enabled .Values.inferenceApiKey -}}true{{- end -}}
{{- end -}}

{{/* One environment variable from the release's Secret. */}}
{{- define "dayzero.secretEnv" -}}
- name: {{ .key }}
  valueFrom:
    secretKeyRef:
      name: {{ include "dayzero.secretName" .root }}
      key: {{ .key }}
      {{- if .optional }}
      optional: true
      {{- end }}
{{- end -}}

{{/*
The environment of a component: config from the ConfigMap, credentials from the Secret, each
process getting only the credentials it uses. Arguments: root and the flags db, celery, key.
*/}}
{{- define "dayzero.env" -}}
{{- $root := .root -}}
envFrom:
  - configMapRef:
      name: {{ include "dayzero.fullname" $root }}-config
env:
{{- if .db }}
{{ include "dayzero.secretEnv" (dict "root" $root "key" "DATABASE_URL") | indent 2 }}
{{- end }}
{{- if .celery }}
{{ include "dayzero.secretEnv" (dict "root" $root "key" "CELERY_BROKER_URL") | indent 2 }}
{{ include "dayzero.secretEnv" (dict "root" $root "key" "CELERY_RESULT_BACKEND" "optional" true) | indent 2 }}
{{- end }}
{{- if and .key (include "dayzero.inferenceKey" $root) }}
{{ include "dayzero.secretEnv" (dict "root" $root "key" "DAYZERO_INFERENCE_API_KEY") | indent 2 }}
{{- end }}
  - name: POD_NAME
    valueFrom: {fieldRef: {fieldPath: metadata.name}}
{{- with $root.Values.extraEnv }}
{{ toYaml . | indent 2 }}
{{- end }}
{{- end -}}

{{/* Pod-level settings shared by every workload. */}}
{{- define "dayzero.podSpecCommon" -}}
serviceAccountName: {{ include "dayzero.serviceAccountName" . }}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . | indent 2 }}
{{- end }}
securityContext:
{{ toYaml .Values.podSecurityContext | indent 2 }}
{{- end -}}

{{/* Container security context: the hardened default, with a component's additions merged over. */}}
{{- define "dayzero.containerSecurityContext" -}}
{{- $sc := deepCopy .root.Values.containerSecurityContext -}}
{{- with .extra }}{{- $sc = mergeOverwrite $sc (deepCopy .) -}}{{- end -}}
{{ toYaml $sc }}
{{- end -}}

{{/* The shared-files volume (attachments, workspaces) when no fsspec URL is configured. */}}
{{- define "dayzero.dataVolume" -}}
{{- $s := .Values.storage -}}
- name: data
{{- if $s.existingClaim }}
  persistentVolumeClaim: {claimName: {{ $s.existingClaim }}}
{{- else if $s.create.enabled }}
  persistentVolumeClaim: {claimName: {{ include "dayzero.fullname" . }}-data}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end -}}

{{/* `--no-create-topics` unless the chart's processes may create the Kafka topics they use. */}}
{{- define "dayzero.topicArgs" -}}
{{- if .Values.kafka.createTopics -}}
[]
{{- else -}}
["--no-create-topics"]
{{- end -}}
{{- end -}}

{{/* A ClusterIP Service in front of a component's metrics port (what a ServiceMonitor selects). */}}
{{- define "dayzero.metricsService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "dayzero.name" . }}-metrics
  labels:
{{ include "dayzero.componentLabels" . | indent 4 }}
spec:
  selector:
{{ include "dayzero.selector" . | indent 4 }}
  ports:
    - name: metrics
      port: {{ .port }}
      targetPort: metrics
{{- end -}}
