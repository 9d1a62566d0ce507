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

{{/* Is model.name a hub id (not a folder path)? "true" or "". */}}
{{- define "specd.modelIsHubId" -}}
{{- if not (hasPrefix "/" .Values.model.name) }}true{{ end }}
{{- end }}

{{/* Does an init container download the hub id into the shared volume? "true" or "". */}}
{{- define "specd.modelDownload" -}}
{{- if and (eq .Values.mode "sidecar") (include "specd.modelIsHubId" .) .Values.model.download }}true{{ end }}
{{- end }}

{{/* The model's folder inside the containers: model.name when it is a path, the download
     folder of a hub id, or empty (a hub id the server resolves itself). */}}
{{- define "specd.modelPath" -}}
{{- if not (include "specd.modelIsHubId" .) }}
{{- .Values.model.name }}
{{- else if include "specd.modelDownload" . }}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.volume.mountPath) .Values.model.name }}
{{- end }}
{{- end }}

{{/* specd's tokenizer: model.tokenizer, else the model's folder. Without one specd would
     run with speculation off, so the chart refuses to render. */}}
{{- define "specd.tokenizer" -}}
{{- $t := default (include "specd.modelPath" .) .Values.model.tokenizer }}
{{- if not $t }}
{{- fail (printf "model.tokenizer is required: specd cannot read the tokenizer of hub id %s (set model.download=true in sidecar mode, or a tokenizer path)" .Values.model.name) }}
{{- end }}
{{- $t }}
{{- end }}

{{/* Is the model volume mounted into specd? In sidecar mode always (it is shared with
     the server); standalone only when model.volume.source is given. */}}
{{- define "specd.mountModelVolume" -}}
{{- if or (eq .Values.mode "sidecar") .Values.model.volume.source }}true{{ end }}
{{- end }}

{{/* The volume holding the model. */}}
{{- define "specd.modelVolume" -}}
{{- $v := deepCopy (default (dict "emptyDir" dict) .Values.model.volume.source) }}
{{- $_ := set $v "name" "model" }}
{{- toYaml (list $v) }}
{{- end }}

{{/* HF_HOME on the shared volume and the optional token, for the server and the download. */}}
{{- define "specd.hfEnv" -}}
- name: HF_HOME
  value: {{ printf "%s/huggingface" (trimSuffix "/" .Values.model.volume.mountPath) | quote }}
{{- with .Values.model.hfTokenSecret }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: HF_TOKEN
{{- end }}
{{- end }}

{{/* The server's arguments written from `model` and upstream.port (a YAML list). */}}
{{- define "specd.serverArgs" -}}
{{- $m := .Values.model }}
{{- $u := .Values.upstream }}
{{- $model := default $m.name (include "specd.modelPath" .) }}
{{- $args := list }}
{{- if eq $u.server "vllm" }}
{{- $args = append $args (printf "--model=%s" $model) }}
{{- with $m.servedName }}{{ $args = append $args (printf "--served-model-name=%s" .) }}{{ end }}
{{- $args = append $args (printf "--port=%v" $u.port) }}
{{- with $m.reasoningParser }}{{ $args = append $args (printf "--reasoning-parser=%s" .) }}{{ end }}
{{- with $m.toolCallParser }}{{ $args = concat $args (list (printf "--tool-call-parser=%s" .) "--enable-auto-tool-choice") }}{{ end }}
{{- else if eq $u.server "sglang" }}
{{- $args = append $args (printf "--model-path=%s" $model) }}
{{- with $m.servedName }}{{ $args = append $args (printf "--served-model-name=%s" .) }}{{ end }}
{{- $args = concat $args (list "--host=0.0.0.0" (printf "--port=%v" $u.port)) }}
{{- with $m.reasoningParser }}{{ $args = append $args (printf "--reasoning-parser=%s" .) }}{{ end }}
{{- with $m.toolCallParser }}{{ $args = append $args (printf "--tool-call-parser=%s" .) }}{{ end }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{/* The init container that downloads a hub id into the shared volume (a one-item list). */}}
{{- define "specd.modelDownloadContainer" -}}
- name: model-download
  image: {{ .Values.upstream.container.image | quote }}
  command:
    - python3
    - -c
    - |
      import sys
      from huggingface_hub import snapshot_download
      print(snapshot_download(repo_id=sys.argv[1], local_dir=sys.argv[2]))
    - {{ .Values.model.name | quote }}
    - {{ include "specd.modelPath" . | quote }}
  env:
    {{- include "specd.hfEnv" . | nindent 4 }}
  volumeMounts:
    - name: model
      mountPath: {{ .Values.model.volume.mountPath }}
{{- end }}

{{/* The upstream container of sidecar mode (a one-item list), named, with the arguments
     written from `model`, the shared model volume, and an optional preStop sleep. */}}
{{- define "specd.upstreamContainer" -}}
{{- $c := deepCopy (required "upstream.container is required in sidecar mode" .Values.upstream.container) }}
{{- $_ := set $c "name" (default "upstream" $c.name) }}
{{- if ne .Values.upstream.server "custom" }}
{{- $_ := set $c "args" (concat (fromYamlArray (include "specd.serverArgs" .)) (default list $c.args)) }}
{{- $_ := set $c "env" (concat (fromYamlArray (include "specd.hfEnv" .)) (default list $c.env)) }}
{{- end }}
{{- $mount := dict "name" "model" "mountPath" .Values.model.volume.mountPath }}
{{- $_ := set $c "volumeMounts" (concat (list $mount) (default list $c.volumeMounts)) }}
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
