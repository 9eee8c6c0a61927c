{{/*
One Deployment of the shared image. Arguments (a dict): root, component, replicas, args,
resources, and optionally ports, probes, securityContext, autoscaling, volumes, volumeMounts,
nodeSelector, tolerations.
*/}}
{{- define "dayzero.deployment" -}}
{{- $root := .root -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "dayzero.fullname" $root }}-{{ .component }}
  labels:
{{ include "dayzero.labels" $root | indent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  {{- if not (and .autoscaling .autoscaling.enabled) }}
  replicas: {{ .replicas }}
  {{- end }}
  selector:
    matchLabels:
{{ include "dayzero.selector" (dict "root" $root "component" .component) | indent 6 }}
  template:
    metadata:
      labels:
{{ include "dayzero.selector" (dict "root" $root "component" .component) | indent 8 }}
      annotations:
        checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
    spec:
{{ include "dayzero.podExtras" $root | indent 6 }}
      {{- with .nodeSelector }}
      nodeSelector:
{{ toYaml . | indent 8 }}
      {{- end }}
      {{- with .tolerations }}
      tolerations:
{{ toYaml . | indent 8 }}
      {{- end }}
      terminationGracePeriodSeconds: 60
      containers:
        - name: {{ .component }}
          image: {{ include "dayzero.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
{{ toYaml .args | indent 12 }}
{{ include "dayzero.env" $root | indent 10 }}
          {{- with .ports }}
          ports:
{{ toYaml . | indent 12 }}
          {{- end }}
          {{- with .probes }}
{{ toYaml . | indent 10 }}
          {{- end }}
          {{- with .securityContext }}
          securityContext:
{{ toYaml . | indent 12 }}
          {{- end }}
          {{- with .volumeMounts }}
          volumeMounts:
{{ toYaml . | indent 12 }}
          {{- end }}
          resources:
{{ toYaml .resources | indent 12 }}
      {{- with .volumes }}
      volumes:
{{ toYaml . | indent 8 }}
      {{- end }}
{{- if and .autoscaling .autoscaling.enabled }}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "dayzero.fullname" $root }}-{{ .component }}
  labels:
{{ include "dayzero.labels" $root | indent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "dayzero.fullname" $root }}-{{ .component }}
  minReplicas: {{ .autoscaling.minReplicas }}
  maxReplicas: {{ .autoscaling.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target: {type: Utilization, averageUtilization: {{ .autoscaling.targetCPUUtilizationPercentage }}}
{{- end }}
{{- end -}}
