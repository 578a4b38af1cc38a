// The /ui page: every node of the extender's ledger, one row each, one bar per GPU split by pod.
// Reads ui/nodes once, then ui/changes?since=TOKEN twice a second; renders only the rows in
// view (a node list of 5,000 rows is a spacer of their height and ~40 row elements), and
// builds every element through the DOM (no HTML strings, so the page's strict
// Content-Security-Policy holds). URLs are relative: the page also works through the API
// server's service proxy.
"use strict";
(function () {
  const ROW_H = 44;
  const OVERSCAN = 6;
  const POLL_MS = 500;
  const SUMMARY_MS = 1000;
  const ROOM_REFRESH_MS = 2000;
  // Rows fetched first, to paint at once; every node follows in a second request.
  const FIRST_ROWS = 120;

  const $ = (id) => document.getElementById(id);
  const list = $("list");
  const rowsBox = $("rows");
  const spacer = $("spacer");

  const model = {
    token: null,
    nodes: [], // sorted by name
    byName: new Map(),
    version: 0, // bumped on every change: rows cache their node's version
    inDoubt: new Set(),
    config: {},
    loaded: false, // every node has arrived once
    total: 0, // nodes the extender holds
  };
  const view = {
    shown: [], // nodes passing the filters, in name order
    filters: { node: "", model: "", ns: "" },
    room: null, // {ask, fits: Map node -> Set(gpu index)} while the filter is on
    cache: new Map(), // node name -> {version, el}
    renderQueued: false,
    summaryAt: 0,
    summaryQueued: false,
  };

  // -- model ------------------------------------------------------------------------------

  function prepare(node) {
    const models = new Set();
    const namespaces = new Set();
    for (const g of node.gpus) {
      models.add(g.model);
      for (const p of g.pods) namespaces.add(p.namespace);
      if (g.wholeOwner) namespaces.add(g.wholeOwner.split("/")[0]);
    }
    node._models = models;
    node._ns = namespaces;
    node._v = ++model.version;
    return node;
  }

  function setAll(nodes) {
    model.nodes = nodes.map(prepare).sort(byNodeName);
    model.byName = new Map(model.nodes.map((n) => [n.name, n]));
    view.cache.clear();
  }

  function byNodeName(a, b) {
    return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
  }

  function applyChanges(answer) {
    let added = false;
    for (const doc of answer.nodes) {
      const old = model.byName.get(doc.name);
      prepare(doc);
      model.byName.set(doc.name, doc);
      if (old) {
        model.nodes[indexOf(doc.name)] = doc;
      } else {
        model.nodes.push(doc);
        added = true;
      }
    }
    if (added) model.nodes.sort(byNodeName);
    if (answer.removed.length) {
      const gone = new Set(answer.removed);
      for (const name of gone) model.byName.delete(name);
      model.nodes = model.nodes.filter((n) => !gone.has(n.name));
    }
    const doubt = new Set(answer.inDoubt);
    const doubtChanged = doubt.size !== model.inDoubt.size || [...doubt].some((u) => !model.inDoubt.has(u));
    model.inDoubt = doubt;
    if (doubtChanged) view.cache.clear();
    return answer.nodes.length + answer.removed.length > 0 || doubtChanged;
  }

  function indexOf(name) {
    let lo = 0;
    let hi = model.nodes.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const here = model.nodes[mid].name;
      if (here === name) return mid;
      if (here < name) lo = mid + 1;
      else hi = mid - 1;
    }
    return -1;
  }

  // -- fetching ---------------------------------------------------------------------------

  async function getJson(url) {
    const resp = await fetch(url, { cache: "no-store" });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body && body.Error ? body.Error : "HTTP " + resp.status);
    return body;
  }

  async function loadAll() {
    if (!model.loaded) {
      // A first screenful, so that the page paints before a large cluster has arrived.
      const first = await getJson("ui/nodes?limit=" + FIRST_ROWS);
      model.config = first.config || {};
      model.total = first.total;
      setAll(first.nodes);
      refilter();
    }
    const doc = await getJson("ui/nodes");
    model.token = doc.token;
    model.config = doc.config || {};
    model.total = doc.total;
    setAll(doc.nodes);
    model.loaded = true;
    fillChoices();
    refilter();
  }

  async function poll() {
    let wait = POLL_MS;
    try {
      if (model.token === null) {
        const asked = performance.now();
        await loadAll();
        note({ at: asked, loadMs: performance.now() - asked, nodes: model.nodes.length });
      } else {
        const asked = performance.now();
        const answer = await getJson("ui/changes?since=" + encodeURIComponent(model.token));
        const got = performance.now();
        if (answer.reset) {
          model.token = null;
          wait = 0;
        } else {
          model.token = answer.token;
          if (applyChanges(answer)) changed();
        }
        note({
          at: asked,
          fetchMs: got - asked,
          applyMs: performance.now() - got,
          nodes: answer.nodes.length,
          reset: answer.reset,
        });
      }
      setLive(true, "live");
    } catch (err) {
      setLive(false, "disconnected: " + err.message);
      wait = 2000;
    }
    setTimeout(poll, wait);
  }

  // The last polls' timings, for whoever wants to know how live the page is (mpschedUi.stats).
  const recent = [];
  function note(entry) {
    recent.push(entry);
    if (recent.length > 200) recent.shift();
  }

  function setLive(ok, text) {
    const live = $("live");
    live.className = ok ? "live on" : "live off";
    live.textContent = ok ? "live" : "offline";
    live.title = text;
  }

  function changed() {
    fillChoices();
    refilter();
    if (view.room) refreshRoomSoon();
  }

  // -- filters ----------------------------------------------------------------------------

  function fillChoices() {
    const models = new Set();
    const namespaces = new Set();
    for (const n of model.nodes) {
      for (const m of n._models) models.add(m);
      for (const s of n._ns) namespaces.add(s);
    }
    syncOptions($("f-model"), [...models].sort(), true);
    syncOptions($("namespaces"), [...namespaces].sort(), false);
  }

  function syncOptions(box, values, keepFirst) {
    const have = [...box.options].slice(keepFirst ? 1 : 0).map((o) => o.value);
    if (have.length === values.length && have.every((v, i) => v === values[i])) return;
    const chosen = box.value;
    while (box.options.length > (keepFirst ? 1 : 0)) box.lastChild.remove();
    for (const v of values) {
      const o = document.createElement("option");
      o.value = v;
      o.textContent = v;
      box.append(o);
    }
    if (keepFirst) box.value = values.includes(chosen) ? chosen : "";
  }

  function refilter() {
    const f = view.filters;
    const fits = view.room ? view.room.fits : null;
    view.shown = model.nodes.filter(
      (n) =>
        (!f.node || n.name.includes(f.node)) &&
        (!f.model || n._models.has(f.model)) &&
        (!f.ns || n._ns.has(f.ns)) &&
        (!fits || fits.has(n.name)),
    );
    spacer.style.height = view.shown.length * ROW_H + "px";
    $("shown").textContent = model.loaded
      ? view.shown.length + " of " + model.nodes.length + " nodes shown"
      : "loading " + model.total + " nodes…";
    queueRender();
    queueSummary();
  }

  function readFilters() {
    view.filters = { node: $("f-node").value.trim(), model: $("f-model").value, ns: $("f-ns").value.trim() };
    view.cache.clear();
    refilter();
  }

  let roomTimer = null;
  function refreshRoomSoon() {
    if (roomTimer !== null) return;
    roomTimer = setTimeout(() => {
      roomTimer = null;
      if (view.room) findRoom(view.room.ask);
    }, ROOM_REFRESH_MS);
  }

  async function findRoom(ask) {
    const query = new URLSearchParams();
    if (ask.threads) query.set("threads", ask.threads);
    if (ask.memory) query.set("memory", ask.memory);
    if (view.filters.ns) query.set("namespace", view.filters.ns);
    const out = $("room-result");
    try {
      const answer = await getJson("status/fit?" + query.toString());
      const fits = new Map(answer.nodes.map((n) => [n.node, new Set(n.gpus)]));
      view.room = { ask, fits };
      let gpus = 0;
      for (const s of fits.values()) gpus += s.size;
      out.textContent = gpus + " GPUs on " + fits.size + " nodes";
      out.className = "";
    } catch (err) {
      view.room = null;
      out.textContent = err.message;
      out.className = "error";
    }
    document.body.dataset.room = view.room ? "on" : "off";
    view.cache.clear();
    refilter();
  }

  function onRoom(ev) {
    ev.preventDefault();
    const ask = { threads: $("room-threads").value.trim(), memory: $("room-memory").value.trim() };
    if (!ask.threads && !ask.memory) {
      clearRoom();
      return;
    }
    findRoom(ask);
  }

  function clearRoom() {
    view.room = null;
    $("room-threads").value = "";
    $("room-memory").value = "";
    $("room-result").textContent = "";
    document.body.dataset.room = "off";
    view.cache.clear();
    refilter();
  }

  // -- rendering --------------------------------------------------------------------------

  function queueRender() {
    if (view.renderQueued) return;
    view.renderQueued = true;
    requestAnimationFrame(render);
  }

  function render() {
    view.renderQueued = false;
    const top = list.scrollTop;
    const first = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
    const last = Math.min(view.shown.length, Math.ceil((top + list.clientHeight) / ROW_H) + OVERSCAN);
    const keep = new Map();
    const els = [];
    for (let i = first; i < last; i++) {
      const node = view.shown[i];
      let hit = view.cache.get(node.name);
      if (!hit || hit.version !== node._v) hit = { version: node._v, el: rowOf(node) };
      keep.set(node.name, hit);
      els.push(hit.el);
    }
    view.cache = keep;
    rowsBox.style.transform = "translateY(" + first * ROW_H + "px)";
    rowsBox.replaceChildren(...els);
    if (!document.body.dataset.painted && els.length) {
      document.body.dataset.painted = "1";
      performance.mark("mpsched-first-rows");
    }
  }

  function el(tag, cls, text) {
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

  function pct(part, whole) {
    return whole > 0 ? Math.min(100, (100 * part) / whole) : 0;
  }

  function rowOf(node) {
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
    const fits = view.room ? view.room.fits.get(node.name) : null;
    for (const g of node.gpus) gpus.append(gpuOf(node, g, fits));
    row.append(gpus);
    return row;
  }

  function gpuOf(node, g, fits) {
    const box = el("div", "gpu");
    box.dataset.node = node.name;
    box.dataset.gpu = String(g.index);
    const cls = [];
    if (g.wholeOwner) cls.push("whole");
    if (g.overBudget) cls.push("over");
    if (g.mps !== "ready") cls.push("mps-" + g.mps);
    if (view.room) cls.push(fits && fits.has(g.index) ? "room" : "noroom");
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
    const ns = view.filters.ns;
    const threads = el("div", "bar threads");
    const memory = el("div", "bar memory");
    const clients = el("div", "bar clients");
    let podMemory = 0;
    for (const p of g.pods) {
      const doubt = p.state === "in_doubt" || model.inDoubt.has(p.uid);
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

  // -- summary ----------------------------------------------------------------------------

  function queueSummary() {
    if (view.summaryQueued) return;
    view.summaryQueued = true;
    const wait = Math.max(0, view.summaryAt + SUMMARY_MS - performance.now());
    setTimeout(summary, wait);
  }

  function summary() {
    view.summaryQueued = false;
    view.summaryAt = performance.now();
    let gpus = 0;
    let whole = 0;
    let over = 0;
    let down = 0;
    let doubt = 0;
    let pods = 0;
    let reserved = 0;
    let frag = 0;
    for (const n of model.nodes) {
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
        for (const p of g.pods) if (p.state === "in_doubt" || model.inDoubt.has(p.uid)) doubt++;
      }
    }
    const parts = [
      model.nodes.length + " nodes",
      gpus + " GPUs",
      pods + " shares",
      whole + " whole",
      (gpus ? reserved / gpus : 0).toFixed(1) + "% threads reserved",
      "frag " + (gpus ? frag / gpus : 0).toFixed(1) + "%",
      over + " over budget",
      doubt + " in doubt",
      down + " MPS down",
    ];
    if (model.config.policy) parts.push("policy " + model.config.policy);
    $("summary").textContent = parts.join(" · ");
  }

  // -- details ----------------------------------------------------------------------------

  function table(rows) {
    const t = el("table");
    for (const [k, v] of rows) {
      const tr = el("tr");
      tr.append(el("th", null, k), el("td", null, v));
      t.append(tr);
    }
    return t;
  }

  async function showPod(uid) {
    const body = $("details-body");
    $("details").hidden = false;
    body.replaceChildren(el("p", null, "loading…"));
    try {
      const p = await getJson("status/pod/" + encodeURIComponent(uid));
      const parts = [el("h2", null, p.namespace + "/" + p.name)];
      parts.push(
        table([
          ["uid", p.uid],
          ["node", p.node],
          ["kind", p.kind],
          ["state", p.state + (model.inDoubt.has(p.uid) ? " (bind in doubt)" : "")],
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
      body.replaceChildren(...parts);
      body.dataset.uid = p.uid;
    } catch (err) {
      body.replaceChildren(el("p", "error", err.message));
    }
  }

  function showGpu(nodeName, index) {
    const node = model.byName.get(nodeName);
    const g = node && node.gpus.find((x) => x.index === index);
    if (!g) return;
    $("details").hidden = false;
    const body = $("details-body");
    body.dataset.uid = "";
    const parts = [el("h2", null, nodeName + " · GPU " + index)];
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
    body.replaceChildren(...parts);
  }

  function onClick(ev) {
    const seg = ev.target.closest("[data-uid]");
    if (seg && seg.dataset.uid) {
      ev.preventDefault();
      showPod(seg.dataset.uid);
      return;
    }
    const gpu = ev.target.closest(".gpu");
    if (gpu) showGpu(gpu.dataset.node, Number(gpu.dataset.gpu));
  }

  // -- wiring -----------------------------------------------------------------------------

  list.addEventListener("scroll", queueRender, { passive: true });
  window.addEventListener("resize", queueRender);
  rowsBox.addEventListener("click", onClick);
  $("details-body").addEventListener("click", onClick);
  $("details-close").addEventListener("click", () => {
    $("details").hidden = true;
  });
  for (const id of ["f-node", "f-ns"]) $(id).addEventListener("input", readFilters);
  $("f-model").addEventListener("change", readFilters);
  $("filters").addEventListener("submit", onRoom);
  $("room-clear").addEventListener("click", clearRoom);
  document.body.dataset.room = "off";
  // For tests and scripts: the model as the page holds it, read-only.
  window.mpschedUi = {
    nodes: () => model.nodes.length,
    shown: () => view.shown.map((n) => n.name),
    token: () => model.token,
    loaded: () => model.loaded,
    stats: () => recent.slice(),
    podOn(node, uid) {
      const n = model.byName.get(node);
      return !!n && n.gpus.some((g) => g.pods.some((p) => p.uid === uid));
    },
    scrollToNode(name) {
      const i = view.shown.findIndex((n) => n.name === name);
      if (i >= 0) list.scrollTop = i * ROW_H;
      render();
      return i;
    },
  };
  poll();
})();
