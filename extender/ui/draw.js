// What the /ui page draws, built through the DOM (no HTML strings: the page's
// Content-Security-Policy allows no inline markup): a node's row with one box per GPU, three
// bars each split by pod, the summary line, and the details of a pod or a GPU. Pure functions
// of the documents the extender serves (ui/nodes, status/pod) and of what the page shows now
// (`ctx`: the room found, the namespace chosen, the binds in doubt).
export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function hue(text) {
  let h = 0;
  for (let i = 0; i < text.length; i++) h = (h * 31 + text.charCodeAt(i)) >>> 0;
  return h;
}

export function pct(part, whole) {
  return whole > 0 ? Math.min(100, (100 * part) / whole) : 0;
}

export function rowOf(node, ctx) {
  const row = el("div", "node");
  row.dataset.node = node.name;
  const head = el("div", "node-head");
  head.append(el("span", "node-name", node.name));
  const meta = el("div", "node-meta");
  const models = [...node._models].join(", ");
  meta.append(el("span", "node-model", node.gpus.length + " × " + (models || "no GPU")));
  const frag = el("span", "node-frag", "frag " + node.fragmentationPct.toFixed(1) + "%");
  frag.title = "fragmentation: share of this node's GPU capacity the expected pods cannot use";
  meta.append(frag);
  if (node.heldByDevicePlugin) {
    meta.append(el("span", "node-held", node.heldByDevicePlugin + " held by nvidia.com/gpu"));
  }
  head.append(meta);
  row.append(head);
  const gpus = el("div", "gpus");
  const fits = ctx.room ? ctx.room.fits.get(node.name) : null;
  for (const g of node.gpus) gpus.append(gpuOf(node, g, fits, ctx));
  row.append(gpus);
  return row;
}

function gpuOf(node, g, fits, ctx) {
  const box = el("div", "gpu");
  box.dataset.node = node.name;
  box.dataset.gpu = String(g.index);
  const cls = [];
  if (g.wholeOwner) cls.push("whole");
  if (g.overBudget) cls.push("over");
  if (g.mps !== "ready") cls.push("mps-" + g.mps);
  if (ctx.room) cls.push(fits && fits.has(g.index) ? "room" : "noroom");
  if (cls.length) box.classList.add(...cls);
  const label = el("div", "gpu-label");
  label.append(el("b", null, String(g.index)));
  let note = "";
  if (g.wholeOwner) note = "whole: " + g.wholeOwner;
  else if (g.mps !== "ready") note = "MPS " + g.mps;
  else if (g.threads.capacity === 0) note = "not shareable";
  else note = g.threads.used + "/" + g.threads.capacity + "%";
  label.append(el("span", null, note));
  box.append(label);
  const title = [node.name + " GPU " + g.index + " · " + g.model, "MPS " + g.mps];
  if (g.overBudget) title.push("over budget: " + g.overBudget);
  box.title = title.join("\n");
  if (g.wholeOwner) {
    for (const kind of ["threads", "memory", "clients"]) {
      const bar = el("div", "bar " + kind);
      const seg = el("span", "seg whole-seg");
      seg.style.width = "100%";
      seg.dataset.owner = g.wholeOwner;
      bar.append(seg);
      box.append(bar);
    }
    return box;
  }
  const ns = ctx.ns;
  const threads = el("div", "bar threads");
  const memory = el("div", "bar memory");
  const clients = el("div", "bar clients");
  let podMemory = 0;
  for (const p of g.pods) {
    const doubt = p.state === "in_doubt" || ctx.inDoubt.has(p.uid);
    const color = "hsl(" + (hue(p.namespace) % 360) + " 55% " + (38 + (hue(p.name) % 25)) + "%)";
    for (const [bar, value, cap] of [
      [threads, p.threads, g.threads.capacity],
      [memory, p.memoryMiB, g.memory.capacityMiB],
      [clients, p.clients, g.clients.capacity],
    ]) {
      const seg = el("span", "seg pod" + (doubt ? " doubt" : "") + (ns && p.namespace !== ns ? " other" : ""));
      seg.style.width = pct(value, cap) + "%";
      seg.style.backgroundColor = color;
      seg.dataset.uid = p.uid;
      seg.dataset.v = String(value);
      seg.title = p.namespace + "/" + p.name + " · " + p.threads + "% · " + p.memoryMiB + " MiB · " + p.clients + " client(s) · " + p.state;
      bar.append(seg);
    }
    podMemory += p.memoryMiB;
  }
  const overhead = g.memory.usedMiB - podMemory;
  if (overhead > 0) {
    const seg = el("span", "seg overhead");
    seg.style.width = pct(overhead, g.memory.capacityMiB) + "%";
    seg.dataset.v = String(overhead);
    seg.title = "MPS client overhead: " + overhead + " MiB";
    memory.append(seg);
  }
  threads.title = "threads " + g.threads.used + "% of " + g.threads.capacity + "%";
  memory.title = "pinned memory " + g.memory.usedMiB + " of " + g.memory.capacityMiB + " MiB";
  clients.title = "MPS clients " + g.clients.used + " of " + g.clients.capacity;
  box.append(threads, memory, clients);
  return box;
}

// The line over the list: counts over every node the page holds.
export function summaryText(nodes, inDoubt, config) {
  let gpus = 0, whole = 0, over = 0, down = 0, doubt = 0, pods = 0, reserved = 0, frag = 0;
  for (const n of nodes) {
    frag += n.fragmentationPct * n.gpus.length;
    for (const g of n.gpus) {
      gpus++;
      if (g.wholeOwner) {
        whole++;
        reserved += 100;
      } else {
        reserved += Math.min(100, pct(g.threads.used, g.threads.capacity));
      }
      if (g.overBudget) over++;
      if (g.mps === "down") down++;
      pods += g.pods.length;
      for (const p of g.pods) if (p.state === "in_doubt" || inDoubt.has(p.uid)) doubt++;
    }
  }
  const parts = [
    nodes.length + " nodes",
    gpus + " GPUs",
    pods + " shares",
    whole + " whole",
    (gpus ? reserved / gpus : 0).toFixed(1) + "% threads reserved",
    "frag " + (gpus ? frag / gpus : 0).toFixed(1) + "%",
    over + " over budget",
    doubt + " in doubt",
    down + " MPS down",
  ];
  if (config.policy) parts.push("policy " + config.policy);
  return parts.join(" · ");
}

function table(rows) {
  const t = el("table");
  for (const [k, v] of rows) {
    const tr = el("tr");
    tr.append(el("th", null, k), el("td", null, v));
    t.append(tr);
  }
  return t;
}

// A pod's allocation (the status/pod document) and its containers' limits.
export function podDetails(p, inDoubt) {
  const parts = [el("h2", null, p.namespace + "/" + p.name)];
  parts.push(
    table([
      ["uid", p.uid],
      ["node", p.node],
      ["kind", p.kind],
      ["state", p.state + (inDoubt.has(p.uid) ? " (bind in doubt)" : "")],
      ["GPUs", p.gpus.map((g) => g.index + " (" + g.uuid + ")").join(", ")],
      ["threads", p.threads + "%"],
      ["pinned memory", p.memoryMiB + " MiB"],
      ["MPS clients", String(p.clients)],
      ["runAsUser", p.runAsUser === null ? "image's user" : String(p.runAsUser)],
      ["priority", String(p.priority)],
    ]),
  );
  if (p.containers.length) {
    parts.push(el("h3", null, "Containers' limits"));
    const t = el("table", "containers");
    const head = el("tr");
    for (const h of ["container", "threads", "pinned memory", "clients"]) head.append(el("th", null, h));
    t.append(head);
    for (const c of p.containers) {
      const tr = el("tr");
      tr.dataset.container = c.name;
      tr.append(el("td", null, c.name), el("td", null, c.threads + "%"), el("td", null, c.memoryMiB + " MiB"), el("td", null, String(c.clients)));
      t.append(tr);
    }
    parts.push(t);
  }
  return parts;
}

// One GPU's own figures and its pods (links to their details).
export function gpuDetails(nodeName, g) {
  const parts = [el("h2", null, nodeName + " · GPU " + g.index)];
  parts.push(
    table([
      ["model", g.model],
      ["uuid", g.uuid],
      ["memory", g.memoryMiB + " MiB (compute " + g.computeCapability + ")"],
      ["MPS", g.mps],
      ["threads", g.threads.used + "% of " + g.threads.capacity + "%"],
      ["pinned memory", g.memory.usedMiB + " of " + g.memory.capacityMiB + " MiB"],
      ["MPS clients", g.clients.used + " of " + g.clients.capacity],
      ["given out whole", g.wholeOwner || "no"],
      ["over budget", g.overBudget || "no"],
    ]),
  );
  if (g.pods.length) {
    parts.push(el("h3", null, "Pods"));
    const ul = el("ul");
    for (const p of g.pods) {
      const li = el("li");
      const a = el("a", null, p.namespace + "/" + p.name);
      a.href = "#";
      a.dataset.uid = p.uid;
      li.append(a, el("span", null, " " + p.threads + "% · " + p.memoryMiB + " MiB · " + p.state));
      ul.append(li);
    }
    parts.push(ul);
  }
  return parts;
}
