{{/*
One Deployment of a dayzero component, with its PodDisruptionBudget and (optionally) its CPU
HorizontalPodAutoscaler. Arguments (a dict):
  root, component, replicas, args, resources, probes (livenessProbe/readinessProbe/startupProbe),
  env (dict of db/celery/key flags) and optionally image, ports, securityContext (merged over the
  hardened default), autoscaling, hpa (false: KEDA owns scaling), data (mount the shared files),
  volumes, volumeMounts, nodeSelector, tolerations, affinity, strategy.
*/}}
{{- define "dayzero.deployment" -}}
{{- $root := .root -}}
{{- $auto := and .autoscaling .autoscaling.enabled -}}
{{- $mountData := and .data (not $root.Values.storage.blobUrl) -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "dayzero.name" . }}
  labels:
{{ include "dayzero.componentLabels" . | indent 4 }}
spec:
  {{- if not $auto }}
  replicas: {{ .replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  {{- with .strategy }}
  strategy:
{{ toYaml . | indent 4 }}
  {{- end }}
  selector:
    matchLabels:
{{ include "dayzero.selector" . | indent 6 }}
  template:
    metadata:
      labels:
{{ include "dayzero.selector" . | indent 8 }}
      annotations:
        checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
        {{- with $root.Values.podAnnotations }}
{{ toYaml . | indent 8 }}
        {{- end }}
    spec:
{{ include "dayzero.podSpecCommon" $root | indent 6 }}
      {{- with (.nodeSelector | default $root.Values.nodeSelector) }}
      nodeSelector:
{{ toYaml . | indent 8 }}
      {{- end }}
      {{- with (.tolerations | default $root.Values.tolerations) }}
      tolerations:
{{ toYaml . | indent 8 }}
      {{- end }}
      {{- with (.affinity | default $root.Values.affinity) }}
      affinity:
{{ toYaml . | indent 8 }}
      {{- end }}
      terminationGracePeriodSeconds: 60
      containers:
        - name: {{ .component }}
          image: {{ .image | default (include "dayzero.image" $root) }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
{{ toYaml .args | indent 12 }}
{{ include "dayzero.env" (merge (dict "root" $root) .env) | indent 10 }}
          {{- with .ports }}
          ports:
{{ toYaml . | indent 12 }}
          {{- end }}
          {{- with .probes }}
{{ toYaml . | indent 10 }}
          {{- end }}
          securityContext:
{{ include "dayzero.containerSecurityContext" (dict "root" $root "extra" .securityContext) | indent 12 }}
          volumeMounts:
            - {name: tmp, mountPath: /tmp}
            {{- if $mountData }}
            - {name: data, mountPath: {{ $root.Values.storage.mountPath }}}
            {{- end }}
            {{- with .volumeMounts }}
{{ toYaml . | indent 12 }}
            {{- end }}
          resources:
{{ toYaml .resources | indent 12 }}
      volumes:
        - name: tmp
          emptyDir: {sizeLimit: {{ $root.Values.tmpSizeLimit }}}
        {{- if $mountData }}
{{ include "dayzero.dataVolume" $root | indent 8 }}
        {{- end }}
        {{- with .volumes }}
{{ toYaml . | indent 8 }}
        {{- end }}
{{- if $root.Values.podDisruptionBudget.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "dayzero.name" . }}
  labels:
{{ include "dayzero.componentLabels" . | indent 4 }}
spec:
  maxUnavailable: {{ $root.Values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
{{ include "dayzero.selector" . | indent 6 }}
{{- end }}
{{- if and $auto (ne .hpa false) }}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "dayzero.name" . }}
  labels:
{{ include "dayzero.componentLabels" . | indent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "dayzero.name" . }}
  minReplicas: {{ .autoscaling.minReplicas }}
  maxReplicas: {{ .autoscaling.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target: {type: Utilization, averageUtilization: {{ .autoscaling.targetCPUUtilizationPercentage }}}
{{- end }}
{{- end -}}

{{/* HTTP liveness/readiness/startup probes on a named port. */}}
{{- define "dayzero.httpProbes" -}}
livenessProbe:
  httpGet: {path: {{ .live }}, port: {{ .port }}}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
readinessProbe:
  httpGet: {path: {{ .ready | default .live }}, port: {{ .port }}}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 3
startupProbe:
  httpGet: {path: {{ .live }}, port: {{ .port }}}
  periodSeconds: {{ .startPeriod | default 2 }}
  timeoutSeconds: 5
  failureThreshold: {{ .startFailures | default 60 }}
{{- end -}}
