// Validates deploy/k8s offline (run by check_k8s.sh, which installs this directory's package.json):
//   node validate_k8s.js --rendered OVERLAY FILE --source SRC [--write-config OUT]
//       every object of `kubectl kustomize` output against the published Kubernetes schemas of its
//       apiVersion and kind (npm's kubernetes-models; @kubernetes-models/prometheus-operator for
//       ServiceMonitor and PrometheusRule), then what DESIGN.md §8 asks of kvtier's objects. OVERLAY is
//       base, dev-cpu or gpu. --write-config writes the ConfigMap's kvtier.yaml (check_k8s.sh starts
//       kvtier-server with it).
//   node validate_k8s.js --raw SRC
//       without kubectl: every whole object in deploy/k8s (patches are partial and skipped) against its
//       schema, and every file a kustomization names exists.
// Exits 0 when everything holds, else prints each problem and exits 1.
'use strict';
const fs = require('fs');
const path = require('path');
const YAML = require('yaml');

const problems = [];
function check(cond, what) {
  if (!cond) problems.push(what);
  return cond;
}

function modelFor(apiVersion, kind) {
  let mod;
  try {
    mod = apiVersion.startsWith('monitoring.coreos.com/')
      ? require(`@kubernetes-models/prometheus-operator/${apiVersion}`)
      : require(`kubernetes-models/${apiVersion}`);
  } catch (e) {
    return null;
  }
  return mod[kind] || null;
}

// Schema validation of one object; `where` names it in messages.
function validateSchema(obj, where) {
  if (!check(obj && typeof obj === 'object' && obj.apiVersion && obj.kind, `${where}: no apiVersion/kind`)) return;
  const Model = modelFor(obj.apiVersion, obj.kind);
  if (!check(Model, `${where}: no schema for ${obj.apiVersion} ${obj.kind}`)) return;
  try {
    new Model(obj).validate();
  } catch (e) {
    problems.push(`${where} (${obj.kind} ${obj.metadata && obj.metadata.name}): ${e.message}`);
  }
}

function parseAll(text, where) {
  return YAML.parseAllDocuments(text).map((d, i) => {
    if (d.errors.length) problems.push(`${where}[${i}]: ${d.errors[0].message}`);
    return d.toJSON();
  }).filter((o) => o !== null && o !== undefined);
}

// JSON with object keys sorted (kustomize reorders keys).
function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(',')}}`;
  return JSON.stringify(v);
}

function matches(selector, labels) {
  return Object.entries(selector || {}).every(([k, v]) => labels && labels[k] === v);
}

const KIND_NAMESPACED = {Namespace: false};

function checkRendered(overlay, file, src, configOut) {
  const objects = parseAll(fs.readFileSync(file, 'utf8'), file);
  objects.forEach((o, i) => validateSchema(o, `${overlay}[${i}]`));
  const byKind = (k) => objects.filter((o) => o.kind === k);
  const one = (k) => {
    const all = byKind(k);
    check(all.length === 1, `${overlay}: want one ${k}, have ${all.length}`);
    return all[0];
  };

  // Names unique per kind; everything but the Namespace in namespace kvtier.
  const seen = new Set();
  for (const o of objects) {
    const key = `${o.kind}/${o.metadata.name}`;
    check(!seen.has(key), `${overlay}: ${key} twice`);
    seen.add(key);
    if (KIND_NAMESPACED[o.kind] !== false) check(o.metadata.namespace === 'kvtier', `${overlay}: ${key} not in namespace kvtier`);
    check(o.metadata.labels && o.metadata.labels['app.kubernetes.io/name'] === 'kvtier',
      `${overlay}: ${key} lacks app.kubernetes.io/name=kvtier`);
  }
  one('Namespace');

  const ds = one('DaemonSet');
  if (!ds) return;
  const pod = ds.spec.template.spec;
  const podLabels = ds.spec.template.metadata.labels;
  check(matches(ds.spec.selector.matchLabels, podLabels), `${overlay}: DaemonSet selector does not match its pods`);
  check(pod.securityContext && pod.securityContext.runAsNonRoot === true && pod.securityContext.runAsUser > 0,
    `${overlay}: pods must run as a non-root user`);
  check(!pod.hostNetwork && !pod.hostPID && !pod.hostIPC, `${overlay}: host namespaces are opt-in, off by default`);
  check(pod.terminationGracePeriodSeconds >= 30, `${overlay}: terminationGracePeriodSeconds < 30 leaves no time to drain`);
  const sa = byKind('ServiceAccount').find((s) => s.metadata.name === pod.serviceAccountName);
  check(sa, `${overlay}: serviceAccountName ${pod.serviceAccountName} is not defined`);
  for (const c of [...(pod.initContainers || []), ...pod.containers]) {
    const sc = c.securityContext || {};
    check(sc.privileged !== true, `${overlay}: container ${c.name} is privileged`);
    check(sc.allowPrivilegeEscalation === false, `${overlay}: container ${c.name} allows privilege escalation`);
    check(sc.capabilities && (sc.capabilities.drop || []).includes('ALL'), `${overlay}: container ${c.name} keeps capabilities`);
    check(/:[A-Za-z0-9_.-]+$/.test(c.image || ''), `${overlay}: container ${c.name} image ${c.image} has no tag`);
    check(!(c.resources && ((c.resources.limits || {})['nvidia.com/gpu'] || (c.resources.requests || {})['nvidia.com/gpu'])),
      `${overlay}: container ${c.name} takes a GPU (see docs/deploy.md on the HBM tier)`);
    check(c.resources && c.resources.requests && c.resources.limits && c.resources.limits.memory,
      `${overlay}: container ${c.name} needs resource requests and a memory limit`);
  }
  const server = pod.containers.find((c) => c.name === 'kvtier-server');
  if (!check(server, `${overlay}: no kvtier-server container`)) return;
  check((server.securityContext || {}).readOnlyRootFilesystem === true, `${overlay}: server root filesystem is writable`);
  const ports = Object.fromEntries((server.ports || []).map((p) => [p.name, p.containerPort]));
  check(ports.grpc === 7400 && ports.ucx === 7401 && ports.metrics === 9400,
    `${overlay}: server ports must be grpc 7400, ucx 7401, metrics 9400 (have ${JSON.stringify(ports)})`);
  const nodeEnv = (server.env || []).find((e) => e.name === 'NODE_NAME');
  check(nodeEnv && nodeEnv.valueFrom && nodeEnv.valueFrom.fieldRef && nodeEnv.valueFrom.fieldRef.fieldPath === 'spec.nodeName',
    `${overlay}: NODE_NAME must come from spec.nodeName`);
  check((server.args || []).includes('--node_id=$(NODE_NAME)'), `${overlay}: the node id must be --node_id=$(NODE_NAME)`);
  for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
    const p = server[probe];
    check(p && p.grpc && p.grpc.port === ports.grpc, `${overlay}: ${probe} must be a gRPC probe on the gRPC port`);
  }
  const preStop = server.lifecycle && server.lifecycle.preStop && server.lifecycle.preStop.exec;
  const cmd = preStop ? preStop.command.join(' ') : '';
  check(/kvtierctl\b.*\bdrain\b/.test(cmd), `${overlay}: preStop must run kvtierctl drain (have "${cmd}")`);
  check(/--members-dns=kvtier-members:7400/.test(cmd), `${overlay}: preStop drain must know the other members`);

  // Volumes: the ConfigMap it mounts exists and holds a config whose addresses match the ports; the
  // disk tier lives on a hostPath that an init container hands to the server's user.
  const volumes = Object.fromEntries((pod.volumes || []).map((v) => [v.name, v]));
  const mounts = Object.fromEntries((server.volumeMounts || []).map((m) => [m.name, m]));
  const cmVolume = Object.values(volumes).find((v) => v.configMap);
  const cm = cmVolume && byKind('ConfigMap').find((c) => c.metadata.name === cmVolume.configMap.name);
  if (check(cm, `${overlay}: the DaemonSet's ConfigMap ${cmVolume && cmVolume.configMap.name} is not defined`)) {
    check(cm.data['kvtier.yaml'] && cm.data['namespaces.json'], `${overlay}: ConfigMap needs kvtier.yaml and namespaces.json`);
    let config = {};
    try {
      config = YAML.parse(cm.data['kvtier.yaml']);
    } catch (e) {
      problems.push(`${overlay}: kvtier.yaml: ${e.message}`);
    }
    try {
      check(Array.isArray(JSON.parse(cm.data['namespaces.json'])), `${overlay}: namespaces.json must be an array`);
    } catch (e) {
      problems.push(`${overlay}: namespaces.json: ${e.message}`);
    }
    const port = (a) => Number(String(a || '').split(':').pop());
    check(port(config.server && config.server.listen_address) === ports.grpc, `${overlay}: server.listen_address is not the grpc port`);
    check(port(config.server && config.server.metrics_address) === ports.metrics, `${overlay}: server.metrics_address is not the metrics port`);
    check(port(config.ucx && config.ucx.listen_address) === ports.ucx, `${overlay}: ucx.listen_address is not the ucx port`);
    check(mounts[cmVolume.name] && (server.args || []).includes(`--config=${mounts[cmVolume.name].mountPath}/kvtier.yaml`),
      `${overlay}: --config does not point into the mounted ConfigMap`);
    check(cmd.includes(`--namespaces-file=${mounts[cmVolume.name] && mounts[cmVolume.name].mountPath}/namespaces.json`),
      `${overlay}: preStop drain must read the mounted namespaces.json`);
    const diskPath = config.disk_tier && config.disk_tier.path;
    const data = Object.values(volumes).find((v) => v.hostPath);
    if (check(data && diskPath, `${overlay}: the disk tier needs a hostPath volume and disk_tier.path`)) {
      const mount = mounts[data.name];
      check(mount && diskPath.startsWith(mount.mountPath + '/'), `${overlay}: disk_tier.path ${diskPath} is not on the hostPath mount`);
      const init = (pod.initContainers || []).find((c) => (c.volumeMounts || []).some((m) => m.name === data.name));
      check(init && /chown\b.*10001/.test((init.command || []).join(' ')) && init.securityContext.runAsUser === 0 &&
        JSON.stringify(init.securityContext.capabilities.add) === '["CHOWN"]',
        `${overlay}: an init container running as root with only CHOWN must chown the hostPath to 10001`);
    }
    // Memory: the limit covers the host tier plus headroom.
    const bytes = (s) => {
      const m = /^(\d+)\s*(B|KiB|MiB|GiB|TiB|Ki|Mi|Gi|Ti)?$/.exec(String(s));
      if (!m) return NaN;
      const unit = {undefined: 1, B: 1, KiB: 2 ** 10, Ki: 2 ** 10, MiB: 2 ** 20, Mi: 2 ** 20, GiB: 2 ** 30, Gi: 2 ** 30,
        TiB: 2 ** 40, Ti: 2 ** 40}[m[2]];
      return Number(m[1]) * unit;
    };
    const host = bytes(config.host_tier && config.host_tier.capacity_bytes);
    const limit = bytes(server.resources.limits.memory);
    check(limit >= host + 2 ** 30, `${overlay}: memory limit ${server.resources.limits.memory} < host tier + 1 GiB`);
    if (configOut) fs.writeFileSync(configOut, cm.data['kvtier.yaml']);
  }

  // Services select the servers and name real ports; one is headless.
  const services = byKind('Service');
  check(services.some((s) => s.spec.clusterIP === 'None'), `${overlay}: no headless Service`);
  check(services.some((s) => s.spec.clusterIP !== 'None'), `${overlay}: no client Service`);
  for (const s of services) {
    check(matches(s.spec.selector, podLabels), `${overlay}: Service ${s.metadata.name} does not select the servers`);
    for (const p of s.spec.ports) {
      check(typeof p.targetPort !== 'string' || p.targetPort in ports, `${overlay}: Service ${s.metadata.name} targets unknown port ${p.targetPort}`);
    }
  }
  const headless = services.find((s) => s.spec.clusterIP === 'None');

  // The NetworkPolicy admits gRPC, UCX and metrics to the servers.
  const np = one('NetworkPolicy');
  if (np) {
    check(matches(np.spec.podSelector.matchLabels, podLabels), `${overlay}: NetworkPolicy does not select the servers`);
    check((np.spec.policyTypes || []).includes('Ingress'), `${overlay}: NetworkPolicy must restrict ingress`);
    const open = new Set([].concat(...(np.spec.ingress || []).map((r) => (r.ports || []).map((p) => p.port))));
    for (const p of [7400, 7401, 9400]) check(open.has(p), `${overlay}: NetworkPolicy does not admit port ${p}`);
  }

  // Monitoring (gpu): the ServiceMonitor scrapes the headless Service as job="kvtier", and the
  // PrometheusRule carries deploy/prometheus/kvtier-rules.yaml.
  const sms = byKind('ServiceMonitor');
  const rules = byKind('PrometheusRule');
  if (overlay === 'gpu') {
    check(sms.length === 1 && rules.length === 1, `${overlay}: needs the monitoring component`);
  }
  for (const sm of sms) {
    const selected = services.filter((s) => matches(sm.spec.selector.matchLabels, s.metadata.labels));
    check(selected.length === 1 && selected[0] === headless, `${overlay}: ServiceMonitor must select the headless Service only`);
    if (headless) {
      check(headless.metadata.labels[sm.spec.jobLabel] === 'kvtier', `${overlay}: the alerts expect job="kvtier"`);
      for (const e of sm.spec.endpoints) check(headless.spec.ports.some((p) => p.name === e.port), `${overlay}: ServiceMonitor port ${e.port} is not on the Service`);
    }
  }
  const rulesFile = YAML.parse(fs.readFileSync(path.join(src, 'deploy/prometheus/kvtier-rules.yaml'), 'utf8'));
  for (const r of rules) {
    check(canonical(r.spec.groups) === canonical(rulesFile.groups),
      `${overlay}: PrometheusRule ${r.metadata.name} differs from deploy/prometheus/kvtier-rules.yaml`);
  }

  // Placement: GPU nodes in production, anywhere in dev.
  const sel = pod.nodeSelector || {};
  if (overlay === 'gpu') {
    check(sel['nvidia.com/gpu.present'] === 'true', `${overlay}: must select GPU nodes`);
    check((pod.tolerations || []).some((t) => t.key === 'nvidia.com/gpu' && t.effect === 'NoSchedule'),
      `${overlay}: must tolerate the nvidia.com/gpu taint`);
  } else {
    check(!sel['nvidia.com/gpu.present'], `${overlay}: must not require GPU nodes`);
  }
  console.log(`${overlay}: ${objects.length} objects`);
}

function checkRaw(src) {
  const root = path.join(src, 'deploy/k8s');
  let objects = 0;
  const walk = (dir) => {
    for (const name of fs.readdirSync(dir)) {
      const p = path.join(dir, name);
      if (fs.statSync(p).isDirectory()) {
        walk(p);
        continue;
      }
      if (name !== 'kustomization.yaml') continue;
      const k = YAML.parse(fs.readFileSync(p, 'utf8'));
      const patches = new Set((k.patches || []).map((x) => x.path).filter(Boolean));
      for (const r of k.resources || []) {
        const target = path.join(dir, r);
        if (!check(fs.existsSync(target), `${p}: resource ${r} does not exist`)) continue;
        if (fs.statSync(target).isDirectory()) continue;
        parseAll(fs.readFileSync(target, 'utf8'), target).forEach((o, i) => {
          ++objects;
          validateSchema(o, `${path.relative(src, target)}[${i}]`);
        });
      }
      for (const c of k.components || []) check(fs.existsSync(path.join(dir, c)), `${p}: component ${c} does not exist`);
      for (const g of k.configMapGenerator || []) {
        for (const f of g.files || []) check(fs.existsSync(path.join(dir, f.split('=').pop())), `${p}: ${f} does not exist`);
      }
      for (const x of patches) {
        const target = path.join(dir, x);
        if (check(fs.existsSync(target), `${p}: patch ${x} does not exist`)) parseAll(fs.readFileSync(target, 'utf8'), target);
      }
    }
  };
  walk(root);
  check(objects > 5, `found only ${objects} objects`);
  console.log(`raw: ${objects} objects`);
}

const args = process.argv.slice(2);
const flag = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
if (args[0] === '--rendered') {
  checkRendered(args[1], args[2], flag('--source'), flag('--write-config'));
} else if (args[0] === '--raw') {
  checkRaw(args[1]);
} else {
  console.error('usage: validate_k8s.js --rendered OVERLAY FILE --source SRC [--write-config OUT] | --raw SRC');
  process.exit(2);
}
for (const p of problems) console.error(`PROBLEM: ${p}`);
process.exit(problems.length ? 1 : 0);
