{{- /*
  Names, labels, images and the checks that join two values, in the style of
  zero-to-jupyterhub's _helpers-names.tpl and _helpers.tpl: every name comes from a helper,
  so a parent chart (or a test) can reach the same names, and every object carries the
  app.kubernetes.io/* labels.
*/}}


{{- /* The prefix of every name: fullnameOverride, else release(-chart). */}}
{{- define "gpupool.fullname" -}}
  {{- if .Values.fullnameOverride }}
    {{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
  {{- else }}
    {{- $name := .Values.nameOverride | default .Chart.Name }}
    {{- if contains $name .Release.Name }}
      {{- .Release.Name | trunc 63 | trimSuffix "-" }}
    {{- else }}
      {{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
    {{- end }}
  {{- end }}
{{- end }}

{{- /* Namespaced objects */}}
{{- define "gpupool.pool.fullname" -}}
  {{- include "gpupool.fullname" . }}
{{- end }}
{{- define "gpupool.config.fullname" -}}
  {{- include "gpupool.fullname" . }}-config
{{- end }}
{{- define "gpupool.secret.fullname" -}}
  {{- include "gpupool.fullname" . }}-secret
{{- end }}
{{- define "gpupool.cookie.fullname" -}}
  {{- include "gpupool.fullname" . }}-cookie
{{- end }}
{{- define "gpupool.pvc.fullname" -}}
  {{- include "gpupool.fullname" . }}-db
{{- end }}
{{- define "gpupool.agent.fullname" -}}
  {{- include "gpupool.fullname" . }}-agent
{{- end }}
{{- define "gpupool.reclaimer.fullname" -}}
  {{- include "gpupool.fullname" . }}-reclaimer
{{- end }}
{{- define "gpupool.upgradeDb.fullname" -}}
  {{- include "gpupool.fullname" . }}-upgrade-db
{{- end }}
{{- define "gpupool.postgresql.fullname" -}}
  {{- include "gpupool.fullname" . }}-postgresql
{{- end }}

{{- /* Cluster-wide objects: unique per namespace too. */}}
{{- define "gpupool.clusterrole.fullname" -}}
  {{- printf "%s-%s" .Release.Namespace (include "gpupool.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- /* ServiceAccounts: created ones default to the component's name. */}}
{{- define "gpupool.serviceAccountName" -}}
  {{- $sa := .sa }}
  {{- if $sa.create }}
    {{- $sa.name | default .default }}
  {{- else }}
    {{- $sa.name | default "default" }}
  {{- end }}
{{- end }}
{{- define "gpupool.pool.serviceAccountName" -}}
  {{- include "gpupool.serviceAccountName" (dict "sa" .Values.pool.serviceAccount "default" (include "gpupool.pool.fullname" .)) }}
{{- end }}
{{- define "gpupool.agent.serviceAccountName" -}}
  {{- include "gpupool.serviceAccountName" (dict "sa" .Values.agent.serviceAccount "default" (include "gpupool.agent.fullname" .)) }}
{{- end }}
{{- define "gpupool.reclaimer.serviceAccountName" -}}
  {{- include "gpupool.serviceAccountName" (dict "sa" .Values.reclaimer.serviceAccount "default" (include "gpupool.reclaimer.fullname" .)) }}
{{- end }}


{{- /*
  Labels. The component is the template's folder (pool, agent, reclaimer, postgresql), as
  z2jh's componentLabel; .componentLabel in the scope overrides it.
*/}}
{{- define "gpupool.componentLabel" -}}
  {{- .componentLabel | default (.Template.Name | dir | base) }}
{{- end }}

{{- define "gpupool.matchLabels" -}}
app.kubernetes.io/name: {{ .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: {{ include "gpupool.componentLabel" . | quote }}
{{- end }}

{{- define "gpupool.labels" -}}
{{ include "gpupool.matchLabels" . }}
app.kubernetes.io/part-of: jupyterhub-gpupool
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name (.Chart.Version | replace "+" "_") | quote }}
{{- end }}


{{- /* An image reference; an empty tag is the chart's appVersion. */}}
{{- define "gpupool.image" -}}
  {{- $image := .image }}
  {{- printf "%s:%s" $image.name ($image.tag | default .root.Chart.AppVersion) }}
{{- end }}

{{- /* The pool's health endpoint, under the service's prefix (no auth: the probes call it). */}}
{{- define "gpupool.healthPath" -}}
  {{- include "gpupool.servicePrefix" . }}health
{{- end }}

{{- /*
  The startupProbe's period and failure threshold of the pool service: its budget
  (period × threshold) is pool.schemaWaitSeconds, the longest the service waits for a
  migration it does not run, plus pool.startupSeconds, so that the kubelet never kills a
  service that is waiting (it exits by itself, with a log line, when the wait ends) nor one
  that is starting. Migrations run in the upgrade-db hook Job or init container, which no
  probe cuts.
*/}}
{{- define "gpupool.pool.startupPeriod" -}}
5
{{- end }}
{{- define "gpupool.pool.startupFailureThreshold" -}}
  {{- $period := int (include "gpupool.pool.startupPeriod" .) }}
  {{- $budget := add (int .Values.pool.schemaWaitSeconds) (int .Values.pool.startupSeconds) }}
  {{- div (add $budget (sub $period 1)) $period }}
{{- end }}

{{- /*
  Where the migrations run (pool.upgradeDb.enabled): "job" (a Helm hook Job, PostgreSQL),
  "init" (an init container of the single SQLite pod, on its volume) or "" (off).
*/}}
{{- define "gpupool.upgradeDb.mode" -}}
  {{- if .Values.pool.upgradeDb.enabled }}
    {{- if eq .Values.database.type "sqlite-pvc" }}init{{ else }}job{{ end }}
  {{- end }}
{{- end }}

{{- /*
  The hook events of the upgrade-db Job. pre-upgrade always: the database and the chart's
  Secrets exist then. pre-install only when the database is external and its URL comes from
  an existing Secret: before an install neither the bundled PostgreSQL nor this chart's own
  Secret exists yet, and a new empty database is created by the service itself (under the
  migration lock).
*/}}
{{- define "gpupool.upgradeDb.hooks" -}}
  {{- if and .Values.database.existingSecret (not .Values.postgresql.enabled) -}}
pre-install,pre-upgrade
  {{- else -}}
pre-upgrade
  {{- end }}
{{- end }}

{{- define "gpupool.imagePullPolicy" -}}
  {{- with .pullPolicy -}}
imagePullPolicy: {{ . }}
  {{- end }}
{{- end }}

{{- define "gpupool.imagePullSecrets" -}}
  {{- with .Values.imagePullSecrets -}}
imagePullSecrets:
    {{- range . }}
  - name: {{ . | quote }}
    {{- end }}
  {{- end }}
{{- end }}


{{- /* URLs and paths the components share. */}}
{{- define "gpupool.servicePrefix" -}}
  {{- printf "/services/%s/" .Values.hub.serviceName }}
{{- end }}
{{- define "gpupool.serviceUrl" -}}
  {{- printf "http://%s:%v%s" (include "gpupool.pool.fullname" .) .Values.pool.port (include "gpupool.servicePrefix" .) }}
{{- end }}
{{- /* Where the agents report: agent.serviceUrl (a remote pool), else this release's. */}}
{{- define "gpupool.agent.serviceUrl" -}}
  {{- .Values.agent.serviceUrl | default (include "gpupool.serviceUrl" .) }}
{{- end }}
{{- define "gpupool.apiUrl" -}}
  {{- include "gpupool.serviceUrl" . }}api/v1/
{{- end }}
{{- define "gpupool.configDir" -}}
/etc/jupyterhub-gpupool
{{- end }}
{{- define "gpupool.sqliteDir" -}}
/srv/jupyterhub-gpupool
{{- end }}


{{- /* Where each token is: z2jh's hub Secret (or another existing one), or ours. */}}
{{- define "gpupool.tokenEnv" -}}
  {{- $tokens := .root.Values.apiTokens -}}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
  {{- if $tokens.existingSecret }}
      name: {{ $tokens.existingSecret | quote }}
      key: {{ get $tokens (printf "%sKey" .which) | quote }}
  {{- else }}
      name: {{ include "gpupool.secret.fullname" .root | quote }}
      key: {{ printf "%s-token" .which | quote }}
  {{- end }}
{{- end }}

{{- /*
  The database URL as an env var: a literal for SQLite; for the bundled PostgreSQL with its
  password in postgresql.existingSecret, composed by Kubernetes from that password ($(VAR)
  refers to the variable before it); else from a Secret.
*/}}
{{- define "gpupool.dbUrlEnv" -}}
  {{- if and (ne .Values.database.type "sqlite-pvc") .Values.postgresql.enabled .Values.postgresql.existingSecret -}}
- name: POSTGRESQL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.postgresql.existingSecret | quote }}
      key: {{ .Values.postgresql.existingSecretKey | quote }}
{{ end -}}
- name: GPUPOOL_DB_URL
  {{- if eq .Values.database.type "sqlite-pvc" }}
  value: {{ printf "sqlite:///%s/jupyterhub-gpupool.sqlite" (include "gpupool.sqliteDir" .) | quote }}
  {{- else if and .Values.postgresql.enabled .Values.postgresql.existingSecret }}
  value: {{ printf "postgresql://gpupool:$(POSTGRESQL_PASSWORD)@%s:5432/gpupool" (include "gpupool.postgresql.fullname" .) | quote }}
  {{- else }}
  valueFrom:
    secretKeyRef:
    {{- if .Values.database.existingSecret }}
      name: {{ .Values.database.existingSecret | quote }}
      key: {{ .Values.database.existingSecretKey | quote }}
    {{- else }}
      name: {{ include "gpupool.secret.fullname" . | quote }}
      key: db-url
    {{- end }}
  {{- end }}
{{- end }}

{{- /* The bundled PostgreSQL's password: from the values, else the one installed (kept). */}}
{{- define "gpupool.postgresql.password" -}}
  {{- if .Values.postgresql.password }}
    {{- .Values.postgresql.password }}
  {{- else }}
    {{- $secret := lookup "v1" "Secret" .Release.Namespace (include "gpupool.secret.fullname" .) }}
    {{- if and $secret (index ($secret.data | default dict) "postgresql-password") }}
      {{- index $secret.data "postgresql-password" | b64dec }}
    {{- else }}
      {{- /* one value per render: the Secret and the URL must agree */}}
      {{- if not (hasKey .Values.postgresql "_generated") }}
        {{- $_ := set .Values.postgresql "_generated" (randAlphaNum 32) }}
      {{- end }}
      {{- .Values.postgresql._generated }}
    {{- end }}
  {{- end }}
{{- end }}


{{- /*
  What the pool service calls on the Kubernetes API, as ClusterRole rules (empty: nothing,
  and its pod gets no token). Each rule is a call in the code:
  - mig.repartition.enabled (kube/labeller.py): GET and PATCH /api/v1/nodes/{name}, and
    GET /api/v1/events?fieldSelector=involvedObject... (the node's events on "failed");
  - occupancy.enabled (kube/occupancy.py): GET /api/v1/nodes; with the device plugin
    (occupancy.backend auto or device-plugin) GET /api/v1/pods; with DRA (auto or dra)
    GET /apis/resource.k8s.io/v1/resourceslices and .../resourceclaims (the GPUs held by pods
    and claims the pool did not place);
  - kueue.enabled (kube/kueue.py): GET /apis/kueue.x-k8s.io/v1beta2/admissionchecks and
    .../workloads, PATCH .../namespaces/{ns}/workloads/{name}/status (the check's state);
    with kueue.deviceBackend dra, POST, GET (list) and DELETE of the Workloads' pool claims
    (/apis/resource.k8s.io/v1/.../resourceclaims).
*/}}
{{- define "gpupool.pool.rbacRules" -}}
  {{- if .Values.pool.enabled }}
    {{- $nodes := list }}
    {{- if .Values.mig.repartition.enabled }}
      {{- $nodes = concat $nodes (list "get" "patch") }}
    {{- end }}
    {{- if .Values.occupancy.enabled }}
      {{- $nodes = concat $nodes (list "list") }}
    {{- end }}
    {{- with $nodes | uniq }}
- apiGroups: [""]
  resources: [nodes]
  verbs: {{ . | toJson }}
    {{- end }}
    {{- if .Values.mig.repartition.enabled }}
- apiGroups: [""]
  resources: [events]
  verbs: ["list"]
    {{- end }}
    {{- if and .Values.occupancy.enabled (ne .Values.occupancy.backend "dra") }}
- apiGroups: [""]
  resources: [pods]
  verbs: ["list"]
    {{- end }}
    {{- if and .Values.occupancy.enabled (ne .Values.occupancy.backend "device-plugin") }}
- apiGroups: [resource.k8s.io]
  resources: [resourceslices, resourceclaims]
  verbs: ["list"]
    {{- end }}
    {{- if .Values.kueue.enabled }}
- apiGroups: [kueue.x-k8s.io]
  resources: [admissionchecks, workloads]
  verbs: ["list"]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: ["patch"]
      {{- if eq .Values.kueue.deviceBackend "dra" }}
- apiGroups: [resource.k8s.io]
  resources: [resourceclaims]
  verbs: ["create", "list", "delete"]
      {{- end }}
    {{- end }}
  {{- end }}
{{- end }}

{{- /*
  Egress rules from a component's networkPolicy (egressAllowRules and egress), in the shape
  of zero-to-jupyterhub's "jupyterhub.networkPolicy.renderEgressRules". Scope: (list root
  netpol). Private ranges: https://en.wikipedia.org/wiki/Private_network
*/}}
{{- define "gpupool.networkPolicy.cloudMetadataIp" -}}
169.254.169.254
{{- end }}
{{- define "gpupool.networkPolicy.renderEgressRules" -}}
{{- $root := index . 0 }}
{{- $netpol := index . 1 }}
{{- $allow := $netpol.egressAllowRules }}
{{- $metadata := include "gpupool.networkPolicy.cloudMetadataIp" $root }}
{{- if or $allow.dnsPortsCloudMetadataServer $allow.dnsPortsKubeSystemNamespace $allow.dnsPortsPrivateIPs }}
# DNS
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
  to:
  {{- if $allow.dnsPortsCloudMetadataServer }}
    - ipBlock:
        cidr: {{ $metadata }}/32
  {{- end }}
  {{- if $allow.dnsPortsKubeSystemNamespace }}
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: kube-system
  {{- end }}
  {{- if $allow.dnsPortsPrivateIPs }}
    - ipBlock:
        cidr: 10.0.0.0/8
    - ipBlock:
        cidr: 172.16.0.0/12
    - ipBlock:
        cidr: 192.168.0.0/16
  {{- end }}
{{- end }}
{{- if $allow.nonPrivateIPs }}
# non-private IPs, but not the cloud metadata server
- to:
    - ipBlock:
        cidr: 0.0.0.0/0
        except:
          - 10.0.0.0/8
          - 172.16.0.0/12
          - 192.168.0.0/16
          - {{ $metadata }}/32
{{- end }}
{{- if $allow.privateIPs }}
# private IPs
- to:
    - ipBlock:
        cidr: 10.0.0.0/8
    - ipBlock:
        cidr: 172.16.0.0/12
    - ipBlock:
        cidr: 192.168.0.0/16
{{- end }}
{{- if $allow.cloudMetadataServer }}
# the cloud metadata server
- to:
    - ipBlock:
        cidr: {{ $metadata }}/32
{{- end }}
{{- with $netpol.egress }}
# the values' own rules
{{ . | toYaml }}
{{- end }}
{{- end }}

{{- /* The ingress rule admitting Prometheus to a port (pool.networkPolicy.prometheus). */}}
{{- define "gpupool.networkPolicy.prometheusIngress" -}}
{{- $prom := .root.Values.pool.networkPolicy.prometheus }}
{{- if $prom.enabled }}
# Prometheus --> metrics
- ports:
    - port: {{ .port }}
  from:
    - namespaceSelector:
        matchLabels:
          {{- $prom.namespaceSelector | toYaml | nindent 10 }}
      podSelector:
        matchLabels:
          {{- $prom.podSelector | toYaml | nindent 10 }}
{{- end }}
{{- end }}


{{- /*
  Checks that join two values (the schema checks single values). Each message starts with
  the key to change.
*/}}
{{- define "gpupool.validate" -}}
  {{- $db := .Values.database }}
  {{- if and (gt (int .Values.pool.replicas) 1) (ne $db.type "postgresql") }}
    {{- fail (printf "pool.replicas: %v replicas need database.type: postgresql (a SQLite file on a ReadWriteOnce volume serves one pod); set pool.replicas: 1 or use PostgreSQL" .Values.pool.replicas) }}
  {{- end }}
  {{- if eq $db.type "postgresql" }}
    {{- $sources := 0 }}
    {{- if $db.url }}{{ $sources = add1 $sources }}{{ end }}
    {{- if $db.existingSecret }}{{ $sources = add1 $sources }}{{ end }}
    {{- if .Values.postgresql.enabled }}{{ $sources = add1 $sources }}{{ end }}
    {{- if eq (int $sources) 0 }}
      {{- fail "database.existingSecret: database.type postgresql needs the database's URL: name a Secret holding it (database.existingSecret, key database.existingSecretKey), or set database.url, or postgresql.enabled: true for a trial database" }}
    {{- end }}
    {{- if gt (int $sources) 1 }}
      {{- fail "database.url: set only one of database.url, database.existingSecret and postgresql.enabled" }}
    {{- end }}
    {{- if and $db.url (not (regexMatch "^postgresql(\\+psycopg)?://" $db.url)) }}
      {{- fail "database.url: a PostgreSQL URL starts with postgresql:// (or postgresql+psycopg://)" }}
    {{- end }}
  {{- else if or $db.url $db.existingSecret .Values.postgresql.enabled }}
    {{- fail "database.type: database.url, database.existingSecret and postgresql.enabled need database.type: postgresql" }}
  {{- end }}
  {{- $tokens := .Values.apiTokens }}
  {{- if not $tokens.existingSecret }}
    {{- range $which := ternary (list "pool" "agent" "reclaimer") (list "agent") .Values.pool.enabled }}
      {{- if not (get $tokens $which) }}
        {{- fail (printf "apiTokens.%s: with apiTokens.existingSecret empty, the chart's Secret needs every token (the same as hub.services in the z2jh values)" $which) }}
      {{- end }}
    {{- end }}
  {{- end }}
  {{- $pdb := .Values.pool.pdb }}
  {{- if and $pdb.enabled (not (typeIs "<nil>" $pdb.maxUnavailable)) (not (typeIs "<nil>" $pdb.minAvailable)) }}
    {{- fail "pool.pdb.minAvailable: a PodDisruptionBudget takes maxUnavailable or minAvailable, not both (set the other to null)" }}
  {{- end }}
  {{- if and .Values.agent.enabled .Values.agent.dynamicMig.enabled .Values.devicePlugin.enabled }}
    {{- fail "agent.dynamicMig.enabled: the agents' dynamic MIG cannot work while the NVIDIA device plugin serves the GPU nodes (devicePlugin.enabled: true): the plugin lists MIG devices only when it starts, so the instances the agents create are never handed to pods, and mig-manager re-applies its own layout; set agent.dynamicMig.enabled: false, or devicePlugin.enabled: false where the device plugin is disabled for these GPUs" }}
  {{- end }}
  {{- if and .Values.mig.repartition.enabled (not .Values.devicePlugin.enabled) }}
    {{- fail "mig.repartition.enabled: re-partitioning through mig-manager waits for the NVIDIA device plugin's nvidia.com/mig-<profile> resources, but devicePlugin.enabled is false; set mig.repartition.enabled: false or devicePlugin.enabled: true" }}
  {{- end }}
  {{- if not .Values.pool.enabled }}
    {{- if not .Values.agent.serviceUrl }}
      {{- fail "agent.serviceUrl: with pool.enabled: false (an agents-only install) the agents report to a pool elsewhere; set agent.serviceUrl to its URL, e.g. https://hub.example.org/services/gpupool/" }}
    {{- end }}
    {{- if .Values.reclaimer.enabled }}
      {{- fail "reclaimer.enabled: the reclaimer runs beside the pool service; with pool.enabled: false set reclaimer.enabled: false (the pool's own release runs it)" }}
    {{- end }}
    {{- if .Values.postgresql.enabled }}
      {{- fail "postgresql.enabled: the bundled PostgreSQL is the pool's database; with pool.enabled: false set postgresql.enabled: false" }}
    {{- end }}
    {{- if not .Values.agent.enabled }}
      {{- fail "pool.enabled: with pool.enabled: false and agent.enabled: false the chart installs nothing; enable one of them" }}
    {{- end }}
  {{- end }}
  {{- if and .Values.mig.repartition.enabled (ne .Values.mig.strategy "mixed") }}
    {{- fail (printf "mig.repartition.enabled: the pool re-partitions MIG GPUs only with mig.strategy mixed (it waits for the device plugin's nvidia.com/mig-<profile> resources), not %s; set mig.strategy: mixed or mig.repartition.enabled: false" .Values.mig.strategy) }}
  {{- end }}
  {{- if and .Values.postgresql.existingSecret (not .Values.postgresql.enabled) }}
    {{- fail "postgresql.existingSecret: names the bundled PostgreSQL's password, which needs postgresql.enabled: true (an external database's URL goes in database.existingSecret)" }}
  {{- end }}
  {{- if and .Values.postgresql.password .Values.postgresql.existingSecret }}
    {{- fail "postgresql.existingSecret: set the password in postgresql.password or postgresql.existingSecret, not both" }}
  {{- end }}
  {{- if and .Values.pool.cookieSecret .Values.pool.existingCookieSecret }}
    {{- fail "pool.existingCookieSecret: set the cookie key in pool.cookieSecret or pool.existingCookieSecret, not both" }}
  {{- end }}
  {{- /* no floating tags: a bare major version or latest moves under a running release */}}
  {{- range $which := list "pool" "agent" "reclaimer" "postgresql" }}
    {{- $tag := (get $.Values $which).image.tag | toString }}
    {{- if or (eq $tag "latest") (regexMatch "^v?[0-9]+$" $tag) (and (eq $which "postgresql") (not $tag)) }}
      {{- fail (printf "%s.image.tag: %q floats (it names a different image as new ones are published); pin a full version, e.g. 17.7 or 1.2.3, optionally with @sha256:<digest>" $which $tag) }}
    {{- end }}
  {{- end }}
  {{- if and .Values.serviceMonitor.tokenSecret.name (not .Values.serviceMonitor.tokenSecret.key) }}
    {{- fail "serviceMonitor.tokenSecret.key: name the key of the token in serviceMonitor.tokenSecret.name" }}
  {{- end }}
{{- end }}
