{{- define "dayzero.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dayzero.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "dayzero.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dayzero.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dayzero.secretName" -}}
{{- .Values.secret.existingSecret | default (printf "%s-secrets" (include "dayzero.fullname" .)) -}}
{{- end -}}

{{- define "dayzero.inferenceUrl" -}}
{{- if .Values.inferenceUrl -}}
{{ .Values.inferenceUrl }}
{{- else if .Values.inference.enabled -}}
http://{{ include "dayzero.fullname" . }}-inference:{{ .Values.inference.port }}
{{- end -}}
{{- end -}}

{{/* Environment shared by every component: config from the ConfigMap, secrets from the Secret. */}}
{{- define "dayzero.env" -}}
envFrom:
  - configMapRef:
      name: {{ include "dayzero.fullname" . }}-config
env:
  - name: DATABASE_URL
    valueFrom: {secretKeyRef: {name: {{ include "dayzero.secretName" . }}, key: DATABASE_URL}}
  - name: CELERY_BROKER_URL
    valueFrom: {secretKeyRef: {name: {{ include "dayzero.secretName" . }}, key: CELERY_BROKER_URL}}
  - name: CELERY_RESULT_BACKEND
    valueFrom: {secretKeyRef: {name: {{ include "dayzero.secretName" . }}, key: CELERY_RESULT_BACKEND, optional: true}}
  - name: DAYZERO_INFERENCE_API_KEY
    valueFrom: {secretKeyRef: {name: {{ include "dayzero.secretName" . }}, key: DAYZERO_INFERENCE_API_KEY, optional: true}}
  - name: POD_NAME
    valueFrom: {fieldRef: {fieldPath: metadata.name}}
{{- with .Values.extraEnv }}
{{ toYaml . | indent 2 }}
{{- end }}
{{- end -}}

{{- define "dayzero.podExtras" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
{{ toYaml . | indent 2 }}
{{- end }}
securityContext:
{{ toYaml .Values.podSecurityContext | indent 2 }}
{{- end -}}
