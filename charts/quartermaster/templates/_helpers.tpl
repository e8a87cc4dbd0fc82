{{/* The chart's name. */}}
{{- define "quartermaster.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object's name: the release name when it contains the chart's name, else
RELEASE-NAME. Objects of config/ named quartermaster-X are named FULLNAME-X here.
*/}}
{{- define "quartermaster.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := include "quartermaster.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "quartermaster.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "quartermaster.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "quartermaster.selectorLabels" -}}
app.kubernetes.io/name: {{ include "quartermaster.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager
{{- end }}

{{- define "quartermaster.serviceAccountName" -}}
{{- default (printf "%s-manager" (include "quartermaster.fullname" .)) .Values.serviceAccount.name }}
{{- end }}

{{- define "quartermaster.nodeAgentServiceAccountName" -}}
{{- printf "%s-node-agent" (include "quartermaster.fullname" .) }}
{{- end }}

{{- define "quartermaster.mirrorCacheServiceAccountName" -}}
{{- printf "%s-mirror-cache" (include "quartermaster.fullname" .) }}
{{- end }}

{{- define "quartermaster.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The controllers this release runs, in the manager's order. */}}
{{- define "quartermaster.controllers" -}}
{{- $on := list }}
{{- range $c := list "namespaces" "vmgroups" "iam" "mirrors" "intents" }}
{{- if (index $.Values $c).enabled }}{{ $on = append $on $c }}{{ end }}
{{- end }}
{{- if not $on }}{{ fail "enable at least one controller (namespaces, vmgroups, iam, mirrors, intents)" }}{{ end }}
{{- join "," $on }}
{{- end }}

{{/*
quartermaster.rename: a name of config/ (quartermaster-X) as this release names it (FULLNAME-X).
Takes (list ROOT NAME).
*/}}
{{- define "quartermaster.rename" -}}
{{- $root := index . 0 }}{{ $name := index . 1 }}
{{- if eq $name "quartermaster-manager" }}
{{- include "quartermaster.serviceAccountName" $root }}
{{- else if hasPrefix "quartermaster" $name }}
{{- printf "%s%s" (include "quartermaster.fullname" $root) (trimPrefix "quartermaster" $name) }}
{{- else }}
{{- $name }}
{{- end }}
{{- end }}

{{/* quartermaster.renamespace: a namespace of config/ as this release places it. Takes (list ROOT NAMESPACE). */}}
{{- define "quartermaster.renamespace" -}}
{{- $root := index . 0 }}{{ $ns := index . 1 }}
{{- $map := dict "quartermaster-system" $root.Release.Namespace "namespace-requests" $root.Values.namespaces.requestsNamespace "quartermaster-mirrors" $root.Values.mirrors.namespace }}
{{- get $map $ns | default $ns }}
{{- end }}

{{/*
quartermaster.rebase: the objects of a file the chart copies from config/rbac (hack/chart-files.sh),
as this release installs them: names FULLNAME-X for quartermaster-X (the manager's ServiceAccount
as serviceAccount.name), the namespaces quartermaster-system, namespace-requests and
quartermaster-mirrors as the release's namespace, namespaces.requestsNamespace and
mirrors.namespace, the same for the ServiceAccounts that admission policies name in CEL (the
manager's, the node agents' and the caches'), and the
chart's labels. Takes (dict "root" ROOT "file" PATH "skip" (list NAMES)).
*/}}
{{- define "quartermaster.rebase" -}}
{{- $root := .root }}
{{- $text := $root.Files.Get .file }}
{{- if not $text }}{{ fail (printf "the chart has no file %s (make manifests)" .file) }}{{ end }}
{{- $manager := printf "system:serviceaccount:%s:%s" $root.Release.Namespace (include "quartermaster.serviceAccountName" $root) }}
{{- $agent := include "quartermaster.nodeAgentServiceAccountName" $root }}
{{- $text = replace "system:serviceaccount:quartermaster-system:quartermaster-manager" $manager $text }}
{{- $text = replace "system:serviceaccount:quartermaster-mirrors:quartermaster-node-agent" (printf "system:serviceaccount:%s:%s" $root.Values.mirrors.namespace $agent) $text }}
{{- $text = replace "'quartermaster-node-agent'" (printf "'%s'" $agent) $text }}
{{- $cache := include "quartermaster.mirrorCacheServiceAccountName" $root }}
{{- $text = replace "system:serviceaccount:quartermaster-mirrors:quartermaster-mirror-cache" (printf "system:serviceaccount:%s:%s" $root.Values.mirrors.namespace $cache) $text }}
{{- $text = replace "'quartermaster-mirror-cache'" (printf "'%s'" $cache) $text }}
{{- $labels := include "quartermaster.labels" $root | fromYaml }}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" $text -1 }}
{{- $obj := fromYaml $doc }}
{{- if and $obj.kind (not (has $obj.metadata.name ($.skip | default list))) }}
{{- $md := $obj.metadata }}
{{- $_ := set $md "name" (include "quartermaster.rename" (list $root $md.name)) }}
{{- if $md.namespace }}{{ $_ := set $md "namespace" (include "quartermaster.renamespace" (list $root $md.namespace)) }}{{ end }}
{{- $_ := set $md "labels" (merge (dict) $labels ($md.labels | default dict)) }}
{{- if $obj.roleRef }}{{ $_ := set $obj.roleRef "name" (include "quartermaster.rename" (list $root $obj.roleRef.name)) }}{{ end }}
{{- if and $obj.spec (kindIs "map" $obj.spec) }}{{ if $obj.spec.policyName }}{{ $_ := set $obj.spec "policyName" (include "quartermaster.rename" (list $root $obj.spec.policyName)) }}{{ end }}{{ end }}
{{- range $s := $obj.subjects | default list }}
{{- $_ := set $s "name" (include "quartermaster.rename" (list $root $s.name)) }}
{{- if $s.namespace }}{{ $_ := set $s "namespace" (include "quartermaster.renamespace" (list $root $s.namespace)) }}{{ end }}
{{- end }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end }}

{{/*
quartermaster.generatedRoles: the roles `make manifests` generates for one controller (or the manager
itself), rebased, each bound to the manager's ServiceAccount. Takes (dict "root" ROOT "name" NAME
"skip" (list NAMES)).
*/}}
{{- define "quartermaster.generatedRoles" -}}
{{- $root := .root }}
{{- $roles := include "quartermaster.rebase" (dict "root" $root "file" (printf "files/rbac/generated/%s.yaml" .name) "skip" .skip) }}
{{- $roles }}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" $roles -1 }}
{{- $role := fromYaml $doc }}
{{- if $role.kind }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ $role.kind }}Binding
metadata:
  name: {{ $role.metadata.name }}
  {{- if $role.metadata.namespace }}
  namespace: {{ $role.metadata.namespace }}
  {{- end }}
  labels:
    {{- include "quartermaster.labels" $root | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: {{ $role.kind }}
  name: {{ $role.metadata.name }}
subjects:
  - kind: ServiceAccount
    name: {{ include "quartermaster.serviceAccountName" $root }}
    namespace: {{ $root.Release.Namespace }}
{{- end }}
{{- end }}
{{- end }}
