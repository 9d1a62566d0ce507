{{- define "specd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "specd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "specd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "specd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "specd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end }}

{{/* The upstream specd talks to: localhost in sidecar mode, a Service otherwise. */}}
{{- define "specd.upstreamURL" -}}
{{- if eq .Values.mode "sidecar" }}
{{- printf "http://127.0.0.1:%v" .Values.upstream.port }}
{{- else }}
{{- required "upstream.url is required in standalone mode" .Values.upstream.url }}
{{- end }}
{{- end }}

{{/* The upstream container of sidecar mode (a one-item list), named, with an optional
     preStop sleep. */}}
{{- define "specd.upstreamContainer" -}}
{{- $c := deepCopy (required "upstream.container is required in sidecar mode" .Values.upstream.container) }}
{{- $_ := set $c "name" (default "upstream" $c.name) }}
{{- if and (gt (int .Values.upstream.preStopSleepSeconds) 0) (not (hasKey $c "lifecycle")) }}
{{- $_ := set $c "lifecycle" (dict "preStop" (dict "sleep" (dict "seconds" (int .Values.upstream.preStopSleepSeconds)))) }}
{{- end }}
{{- toYaml (list $c) }}
{{- end }}

{{/* specd's resources, with the GPU request for the draft model. */}}
{{- define "specd.resources" -}}
{{- $r := deepCopy (default dict .Values.specd.resources) }}
{{- if gt (int .Values.specd.gpu) 0 }}
{{- $limits := default dict $r.limits }}
{{- $_ := set $limits "nvidia.com/gpu" (int .Values.specd.gpu) }}
{{- $_ := set $r "limits" $limits }}
{{- end }}
{{- toYaml $r }}
{{- end }}
