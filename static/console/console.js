// Switchboard operator console: live updates over one WebSocket, and the holds queue's keyboard.
//
// Every piece of text that came from an agent (names, summaries, message text) is written into the
// page with textContent or an input's value, never as HTML: it is untrusted, model-written input.
// Pages are rendered by the server; this script only keeps them current.
"use strict";

(function () {
  const body = document.body;
  if (!body || !body.dataset.wsPath) return; // the login page has no live parts

  let cursor = Number(body.dataset.cursor || "0");
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));

  // ---------------------------------------------------------------- small formatting helpers
  const who = (p) => (p ? p.name + (p.hub ? "@" + p.hub : "") + " [" + p.ref + "]" : "");
  // A timestamp with its date: a feed left open overnight must not show yesterday as today.
  const clock = (iso) => (iso ? String(iso).slice(0, 10) + " " + String(iso).slice(11, 19) : "");
  const truncate = (text, n) => (text && text.length > n ? text.slice(0, n - 1) + "…" : text || "");

  function ago(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return s + "s ago";
    if (s < 3600) return Math.floor(s / 60) + "m ago";
    if (s < 86400) return Math.floor(s / 3600) + "h ago";
    return Math.floor(s / 86400) + "d ago";
  }

  function duration(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + String(s % 60).padStart(2, "0") + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h " + String(Math.floor(s / 60) % 60).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d " + (Math.floor(s / 3600) % 24) + "h";
  }

  function remaining(ms) {
    const s = Math.max(0, Math.floor(ms / 1000));
    const m = Math.floor(s / 60);
    if (m >= 60) return Math.floor(m / 60) + "h " + String(m % 60).padStart(2, "0") + "m";
    return m + "m " + String(s % 60).padStart(2, "0") + "s";
  }

  function setSlot(root, name, text) {
    $$('[data-slot="' + name + '"]', root).forEach((el) => {
      el.textContent = text == null ? "" : String(text);
    });
  }

  function setLinks(root, kind, id) {
    const base = kind === "message" ? "/messages/" : "/sessions/";
    $$('[data-link="' + kind + '"]', root).forEach((a) => a.setAttribute("href", base + encodeURIComponent(id) + "/"));
  }

  function fromTemplate(id) {
    const tpl = document.getElementById(id);
    return tpl ? tpl.content.firstElementChild.cloneNode(true) : null;
  }

  // A row's visible text and state, to tell a real change from a catch-up that repeats what we have.
  // Clocks tick on their own, so they are left out.
  function signature(el) {
    const texts = $$("[data-slot]", el)
      .filter((s) => s.dataset.slot !== "time" && s.dataset.slot !== "last_seen")
      .map((s) => s.textContent);
    return texts.join("|") + "|" + (el.dataset.state || "") + "|" + (el.dataset.status || "");
  }

  function flash(el, before) {
    if (before !== undefined && before === signature(el)) return;
    el.classList.remove("changed");
    void el.offsetWidth; // restart the highlight animation
    el.classList.add("changed");
  }

  // ---------------------------------------------------------------- status line and notices
  const live = $("#live");
  function setLive(state, text) {
    if (!live) return;
    live.dataset.state = state;
    live.textContent = text;
  }

  function notice(text, kind) {
    const el = $("#notice");
    if (!el) return;
    el.textContent = text;
    el.dataset.kind = kind || "info";
  }

  // ---------------------------------------------------------------- held count in the nav
  const badge = $("#held-count");
  const baseTitle = document.title;
  function setHeldCount(n) {
    if (!badge) return;
    n = Math.max(0, n);
    // Held messages show in the tab title too, so an operator on another tab sees them arrive.
    document.title = (n ? "(" + n + " held) " : "") + baseTitle;
    badge.textContent = String(n);
    badge.setAttribute("aria-label", n + " held");
    badge.classList.toggle("badge-alert", n > 0);
  }
  const heldCount = () => Number(badge ? badge.textContent : "0") || 0;

  // ---------------------------------------------------------------- the attention strip
  // Its figures are the server's (selectors.attention): holds pending, escalated, the next expiry
  // and dead sessions. Events only say that something changed; the page then asks for the figures.
  const strip = $("[data-attention-strip]");
  let attentionTimer = null;

  function setAttention(a) {
    if (!strip || !a) return;
    const set = (name, n) => {
      const link = $('[data-attention="' + name + '"]', strip);
      if (link) link.dataset.count = String(n);
    };
    setSlot(strip, "held", a.held);
    setSlot(strip, "held-words", a.held === 1 ? "hold pending" : "holds pending");
    setSlot(strip, "escalated", a.escalated);
    setSlot(strip, "dead", a.dead);
    setSlot(strip, "dead-words", a.dead === 1 ? "dead agent" : "dead agents");
    set("held", a.held);
    set("escalated", a.escalated);
    set("dead", a.dead);
    set("next-expiry", a.next_expiry ? 1 : 0);
    $$('[data-slot="next-expiry"]', strip).forEach((el) => (el.dataset.expires = a.next_expiry || ""));
    if (typeof a.held === "number" && !holdsTable) setHeldCount(a.held);
    tickCountdowns();
  }

  async function refreshAttention() {
    if (!strip || !body.dataset.attentionUrl) return;
    try {
      const response = await fetch(body.dataset.attentionUrl, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (response.ok && !new URL(response.url).pathname.startsWith("/login")) setAttention(await response.json());
    } catch (err) {
      // offline: the socket's status line says so; the next event or tick tries again
    }
  }

  function scheduleAttention() {
    clearTimeout(attentionTimer);
    attentionTimer = setTimeout(refreshAttention, 400);
  }

  // ---------------------------------------------------------------- the message feed
  function feedTables() {
    return $$("table[data-feed]");
  }

  function upsertFeedRow(d) {
    feedTables().forEach((table) => {
      const only = (table.dataset.feedSessions || "").split(" ").filter(Boolean);
      if (only.length && !((d.from && only.includes(d.from.id)) || (d.to && only.includes(d.to.id)))) return;
      if (table.dataset.feedTier && d.tier !== table.dataset.feedTier) return;
      const known = $('tr[data-delivery-id="' + d.delivery_id + '"]', table.tBodies[0]);
      if (!known && table.dataset.feedState && d.state !== table.dataset.feedState) return;
      const tbody = table.tBodies[0];
      let row = $('tr[data-delivery-id="' + d.delivery_id + '"]', tbody);
      const before = row ? signature(row) : undefined;
      if (!row) {
        row = fromTemplate("tpl-delivery-row");
        if (!row) return;
        row.dataset.deliveryId = String(d.delivery_id);
        const empty = $("tr.empty", tbody);
        if (empty) empty.remove();
        tbody.insertBefore(row, tbody.firstElementChild);
        while (tbody.rows.length > 200) tbody.deleteRow(-1);
      }
      row.dataset.messageId = d.message_id;
      const time = $('[data-slot="time"]', row);
      if (time && d.created_at) time.setAttribute("datetime", d.created_at);
      setSlot(row, "time", clock(d.created_at));
      setSlot(row, "from", d.from ? who(d.from) : "hub");
      setSlot(row, "to", who(d.to));
      setSlot(row, "tier", d.tier);
      setSlot(row, "text", d.summary || truncate(d.preview, 140));
      setLinks(row, "message", d.message_id);
      row.dataset.tier = d.tier || "";
      row.dataset.state = d.state;
      setSlot(row, "state", d.state);
      flash(row, before);
    });
  }

  function setFeedState(row, state) {
    const before = signature(row);
    row.dataset.state = state;
    setSlot(row, "state", state);
    flash(row, before);
  }

  function updateFeedState(deliveryId, state) {
    $$('table[data-feed] tr[data-delivery-id="' + deliveryId + '"]').forEach((row) => setFeedState(row, state));
  }

  // ---------------------------------------------------------------- the holds queue
  // Rows are rendered by the server, grouped by sender, recipient and reason. A hold that arrives
  // while the operator reads is not inserted (rows would move under the pointer): it is counted in
  // the "N new" button, and a click (or n) fetches the queue again and shows them, keeping what was
  // typed, ticked, opened and focused. Decided holds leave at once: that is what the operator did.
  let holdsTable = $("table[data-holds]");
  const newHolds = new Set();
  const pill = $("[data-new-holds]");

  function holdRows() {
    return holdsTable ? $$("tbody tr.hold", holdsTable) : [];
  }

  function visibleHoldRows() {
    return holdRows().filter((r) => !r.closest("tbody[data-collapsed]"));
  }

  function refreshHoldsChrome() {
    if (!holdsTable) return;
    const n = holdRows().length;
    const count = $('[data-count="holds"]');
    if (count) count.textContent = String(n);
    const empty = $("[data-holds-empty]");
    if (empty) empty.hidden = n > 0;
    setHeldCount(n + newHolds.size);
    if (pill) {
      pill.hidden = newHolds.size === 0;
      setSlot(pill, "new-count", newHolds.size);
    }
    updateSelected();
  }

  function holdWanted(h) {
    const only = holdsTable.dataset.recipientFilter;
    const recipient = h.recipient || h.to;
    if (only && !(recipient && recipient.id === only)) return false;
    if (holdsTable.hasAttribute("data-escalated-filter") && h.escalate !== "required") return false;
    return true;
  }

  // A hold arrives from a `message.sent` event or a catch-up after a gap.
  function noteNewHold(h) {
    if (!holdsTable || !holdWanted(h)) return;
    if ($('tr[data-delivery-id="' + h.delivery_id + '"]', holdsTable)) return;
    newHolds.add(String(h.delivery_id));
    // Nothing on screen to shift: show it straight away.
    if (!holdRows().length) showNewHolds();
    else refreshHoldsChrome();
  }

  // What the operator has done to the queue, to carry over a fresh rendering of it.
  function holdsState() {
    const reasons = {};
    $$("input[data-reason-input]", holdsTable).forEach((input) => {
      const key = input.closest("tr.hold") ? "d" + input.closest("tr.hold").dataset.deliveryId : "g" + input.closest("tbody").dataset.group;
      if (input.value) reasons[key] = input.value;
    });
    const active = document.activeElement;
    return {
      reasons: reasons,
      checked: selectedIds(),
      open: $$("tbody.hold-group:not([data-collapsed])", holdsTable).map((g) => g.dataset.group),
      current: current() ? current().dataset.deliveryId : null,
      focusKey: active && holdsTable.contains(active) && active.matches("input[data-reason-input]")
        ? (active.closest("tr.hold") ? "d" + active.closest("tr.hold").dataset.deliveryId : "g" + active.closest("tbody").dataset.group)
        : null,
    };
  }

  function restoreHoldsState(state) {
    $$("input[data-reason-input]", holdsTable).forEach((input) => {
      const row = input.closest("tr.hold");
      const key = row ? "d" + row.dataset.deliveryId : "g" + input.closest("tbody").dataset.group;
      if (state.reasons[key]) input.value = state.reasons[key];
      if (state.focusKey === key) input.focus();
    });
    $$('input[type=checkbox][name="delivery_ids"]', holdsTable).forEach((c) => {
      c.checked = state.checked.includes(c.value);
    });
    state.open.forEach((key) => {
      const group = $('tbody[data-group="' + CSS.escape(key) + '"]', holdsTable);
      if (group) setGroupOpen(group, true);
    });
    if (state.current) {
      const row = $('tr.hold[data-delivery-id="' + state.current + '"]', holdsTable);
      if (row) row.classList.add("current");
    }
  }

  // One fetch of the queue at a time: an older rendering must never replace a newer one. A
  // request made meanwhile runs once the fetch in flight is done.
  let showing = null;
  let showAgain = false;

  function showNewHolds() {
    if (showing) {
      showAgain = true;
      return showing;
    }
    showing = fetchNewHolds().finally(() => {
      showing = null;
      if (showAgain) {
        showAgain = false;
        if (newHolds.size) showNewHolds();
      }
    });
    return showing;
  }

  // This page as the server renders it now, parsed; null when it cannot be had (offline, an
  // error, or a session that ended and was sent to the login page). A page shown as the answer to
  // a form (a revealed message) names the address that renders it again (data-page-url).
  async function fetchThisPage() {
    let response;
    try {
      response = await fetch(body.dataset.pageUrl || location.href, { credentials: "same-origin", headers: { Accept: "text/html" } });
    } catch (err) {
      return null;
    }
    if (!response.ok || new URL(response.url).pathname.startsWith("/login")) return null;
    return new DOMParser().parseFromString(await response.text(), "text/html");
  }

  async function fetchNewHolds() {
    const region = $('[data-live-region="holds"]');
    if (!region) return;
    // Every hold noted before this request is in its answer, or is no longer held.
    const arrived = Array.from(newHolds);
    const fresh = await fetchThisPage();
    if (!fresh) return;
    const replacement = fresh.querySelector('[data-live-region="holds"]');
    if (!replacement) return;
    const state = holdsState();
    region.replaceWith(document.adoptNode(replacement));
    holdsTable = $("table[data-holds]");
    restoreHoldsState(state);
    arrived.forEach((id) => {
      newHolds.delete(id);
      const row = $('tr.hold[data-delivery-id="' + id + '"]', holdsTable);
      if (!row) return;
      const group = row.closest("tbody.hold-group");
      flash(group && group.hasAttribute("data-collapsed") ? $("tr.group-head", group) : row, undefined);
    });
    tickCountdowns();
    tickAges();
    refreshHoldsChrome();
  }

  function setGroupOpen(group, open) {
    if (open) group.removeAttribute("data-collapsed");
    else group.setAttribute("data-collapsed", "");
    const toggle = $("[data-group-toggle]", group);
    if (toggle) toggle.setAttribute("aria-expanded", String(open));
  }

  function groupIds(group) {
    return $$("tr.hold", group).map((r) => r.dataset.deliveryId);
  }

  function removeHoldRow(deliveryId) {
    newHolds.delete(String(deliveryId));
    if (!holdsTable) return false;
    const row = $('tr[data-delivery-id="' + deliveryId + '"]', holdsTable);
    if (!row) {
      refreshHoldsChrome();
      return false;
    }
    if (row.classList.contains("current")) {
      const rows = visibleHoldRows();
      const at = rows.indexOf(row);
      const next = rows[at + 1] || rows[at - 1];
      const hadFocus = row.contains(document.activeElement) || document.activeElement === document.body;
      if (next) setCurrent(next, hadFocus);
    }
    const group = row.closest("tbody.hold-group");
    row.remove();
    // The queue emptied with new holds waiting: nothing is left to shift, so show them now.
    if (!holdRows().length && newHolds.size) showNewHolds();
    if (group) {
      const left = groupIds(group);
      if (!left.length) group.remove();
      else {
        refreshGroupLine(group);
        $$('form[data-group-form] input[type=hidden][name="delivery_ids"]', group).forEach((input) => {
          if (input.value === String(deliveryId)) input.remove();
        });
      }
    }
    refreshHoldsChrome();
    tickAges();
    tickCountdowns();
    return true;
  }

  // The earliest time among the rows' `selector` elements' data-`key` values ("" when none).
  function earliestOf(rows, selector, key) {
    const times = rows
      .map((row) => $(selector, row))
      .filter((el) => el && !isNaN(Date.parse(el.dataset[key])))
      .map((el) => el.dataset[key]);
    times.sort((x, y) => Date.parse(x) - Date.parse(y));
    return times[0] || "";
  }

  // A group's line states facts about the holds still in it: when one leaves (decided, expired),
  // its count, escalated count, oldest age and next expiry are taken again from the rows left.
  function refreshGroupLine(group) {
    const rows = $$("tr.hold", group);
    $$("[data-group-count]", group).forEach((el) => (el.textContent = String(rows.length)));
    const escalated = rows.filter((row) => row.dataset.escalate === "required").length;
    const part = $("[data-group-escalated-part]", group);
    if (part) {
      part.hidden = escalated === 0;
      $("[data-group-escalated]", part).textContent = String(escalated);
    }
    const oldest = $("[data-group-oldest]", group);
    if (oldest) oldest.dataset.age = earliestOf(rows, ".age[data-age]", "age");
    const next = $("[data-group-next-expiry]", group);
    if (next) next.dataset.expires = earliestOf(rows, '.countdown[data-slot="expires"]', "expires");
  }

  // ---------------------------------------------------------------- sessions on the dashboard
  function policyLabel(s) {
    if (s.inbound_policy && s.operator_policy) return s.inbound_policy + " (operator: " + s.operator_policy + ")";
    if (s.operator_policy) return s.operator_policy + " (operator)";
    if (s.inbound_policy) return s.inbound_policy;
    return "by mode (" + (s.permission_mode || "default") + ")";
  }

  function upsertSessionRow(s) {
    const table = $("table[data-sessions]");
    if (!table) return;
    const tbody = table.tBodies[0];
    let row = $('tr[data-session-id="' + s.id + '"]', tbody);
    const before = row ? signature(row) : undefined;
    if (!row) {
      if (!s.name) return; // a policy event for a session this page does not list
      if (table.hasAttribute("data-dead-only") && s.liveness !== "dead") return;
      row = fromTemplate("tpl-session-row");
      if (!row) return;
      row.dataset.sessionId = s.id;
      const empty = $("tr.empty", tbody);
      if (empty) empty.remove();
      tbody.insertBefore(row, tbody.firstElementChild);
      const count = $('[data-count="sessions"]');
      if (count) count.textContent = String(tbody.rows.length);
    }
    if (s.name) {
      setSlot(row, "label", who(s));
      setLinks(row, "session", s.id);
      setSlot(row, "kind", s.kind);
      setSlot(row, "peer_address", s.peer_address);
    }
    if (s.status) {
      row.dataset.rawStatus = s.status;
      const time = $('[data-slot="last_seen"]', row);
      if (time && s.last_seen) time.setAttribute("datetime", s.last_seen);
      // Dead or not is the server's verdict (messaging.liveness), never recomputed here.
      const status = s.liveness || s.display_status || s.status;
      row.dataset.status = status;
      setSlot(row, "status", status);
    }
    // Events carry only some policy fields (a session's own policy, or the operator's); the row keeps
    // the others so the label is always built from all three.
    if (!("sender" in s)) {
      if ("inbound_policy" in s) row.dataset.inboundPolicy = s.inbound_policy || "";
      if ("operator_policy" in s) row.dataset.operatorPolicy = s.operator_policy || "";
      if (s.permission_mode) row.dataset.permissionMode = s.permission_mode;
      setSlot(
        row,
        "policy",
        policyLabel({
          inbound_policy: row.dataset.inboundPolicy,
          operator_policy: row.dataset.operatorPolicy,
          permission_mode: row.dataset.permissionMode,
        })
      );
    }
    if (s.team) setSlot(row, "team", s.team.name);
    tickClocks();
    flash(row, before);
  }

  // ---------------------------------------------------------------- clocks and countdowns
  function tickClocks() {
    $$("time[data-relative]").forEach((t) => {
      const at = Date.parse(t.getAttribute("datetime") || "");
      if (!isNaN(at)) {
        t.textContent = ago(Date.now() - at);
        t.title = t.getAttribute("datetime");
      }
    });
  }

  function tickAges() {
    $$("[data-age]").forEach((el) => {
      const at = Date.parse(el.dataset.age);
      if (isNaN(at)) return;
      el.textContent = duration(Date.now() - at);
    });
  }

  function tickCountdowns() {
    $$(".countdown[data-expires]").forEach((el) => {
      const at = Date.parse(el.dataset.expires);
      if (isNaN(at)) {
        el.textContent = el.dataset.none || "no deadline";
        el.classList.remove("soon", "over");
        return;
      }
      const left = at - Date.now();
      el.textContent = left <= 0 ? "expiring…" : remaining(left);
      el.classList.toggle("soon", left > 0 && left < 60000);
      el.classList.toggle("over", left <= 0);
      el.title = "expires at " + el.dataset.expires;
    });
  }

  // ---------------------------------------------------------------- server-rendered regions
  // Pages with rosters, boards or histories are re-fetched (debounced) when a matching event arrives,
  // and their [data-live-region] parts swapped for the fresh server rendering (already escaped).
  const refreshOn = (body.dataset.refreshOn || "").split(/\s+/).filter(Boolean);
  const refreshMatch = body.dataset.refreshMatch || "";
  let refreshTimer = null;

  function wantsRefresh(kind, data) {
    if (!$("[data-live-region]:not([data-live-manual])")) return false;
    if (refreshOn.includes("*")) return true;
    if (refreshOn.some((prefix) => kind.startsWith(prefix))) return true;
    return Boolean(refreshMatch) && JSON.stringify(data || {}).includes(refreshMatch);
  }

  function scheduleRefresh() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(refreshRegions, 300);
  }

  async function refreshRegions() {
    const fresh = await fetchThisPage();
    if (!fresh) return;
    $$("[data-live-region]:not([data-live-manual])").forEach((region) => {
      const name = region.dataset.liveRegion;
      const replacement = fresh.querySelector('[data-live-region="' + name + '"]');
      if (!replacement || region.contains(document.activeElement)) return;
      // A card or section the operator opened stays open across the fresh rendering.
      const open = $$("details[open][data-open-key]", region).map((d) => d.dataset.openKey);
      open.forEach((key) => {
        const again = replacement.querySelector('details[data-open-key="' + CSS.escape(key) + '"]');
        if (again) again.open = true;
      });
      region.replaceWith(document.adoptNode(replacement));
    });
    tickClocks();
    tickCountdowns();
    tickAges();
  }

  // ---------------------------------------------------------------- applying events
  function applyDelivery(d) {
    upsertFeedRow(d);
    if (d.state === "held") noteNewHold(d);
    else removeHoldRow(d.delivery_id);
  }

  const handlers = {
    "message.sent": (d) => {
      upsertFeedRow(d);
      if (d.state === "held") {
        if (holdsTable) noteNewHold(d);
        else setHeldCount(heldCount() + 1);
        scheduleAttention();
      }
    },
    "delivery.changed": (d) => {
      updateFeedState(d.delivery_id, d.state);
      if (d.from === "held" && d.state !== "held") {
        if (!removeHoldRow(d.delivery_id) && !holdsTable) setHeldCount(heldCount() - 1);
        scheduleAttention();
      }
    },
    "session.changed": (s) => {
      upsertSessionRow(s);
      scheduleAttention();
    },
    "session.policy": (s) => upsertSessionRow(s),
  };

  // The page's other scripts (alerts.js) hear the one live socket through document events
  // instead of opening a socket of their own.
  function tell(name, detail) {
    document.dispatchEvent(new CustomEvent(name, { detail: detail }));
  }

  function dispatch(kind, data) {
    const handler = handlers[kind];
    if (handler) handler(data || {});
    if (wantsRefresh(kind, data)) scheduleRefresh();
    tell("switchboard:event", { kind: kind, data: data || {} });
  }

  // ---------------------------------------------------------------- catching up after a gap
  async function catchUp(allSessions) {
    let url = body.dataset.updatesUrl + "?after=" + encodeURIComponent(String(cursor));
    if (allSessions === true) url += "&sessions=all";
    let response;
    try {
      response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    } catch (err) {
      return;
    }
    if (new URL(response.url).pathname.startsWith("/login")) {
      setLive("off", "logged out — reload to log in");
      return;
    }
    if (!response.ok) return;
    const update = await response.json();
    if (update.reload) {
      location.reload();
      return;
    }
    (update.deliveries || []).forEach(applyDelivery);
    (update.sessions || []).forEach(upsertSessionRow);
    if (update.attention) setAttention(update.attention);
    if ((update.teams && refreshOn.some((p) => p.startsWith("team"))) || (update.deliveries || []).length) {
      if ($("[data-live-region]:not([data-live-manual])")) scheduleRefresh();
    }
    cursor = Math.max(cursor, Number(update.cursor) || 0);
  }

  // ---------------------------------------------------------------- the socket
  let socket = null;
  let attempts = 0;
  let pinger = null;
  let paused = false;

  function connect() {
    paused = false;
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    setLive("connecting", attempts ? "reconnecting…" : "connecting…");
    socket = new WebSocket(scheme + location.host + body.dataset.wsPath);
    socket.addEventListener("open", () => {
      attempts = 0;
      setLive("on", "live");
      tell("switchboard:live", { open: true });
      catchUp(); // whatever changed between rendering this page (or losing the socket) and now
      clearInterval(pinger);
      pinger = setInterval(() => {
        if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ kind: "ping" }));
      }, 25000);
    });
    socket.addEventListener("message", (e) => {
      let event;
      try {
        event = JSON.parse(e.data);
      } catch (err) {
        return;
      }
      if (event && typeof event.kind === "string") dispatch(event.kind, event.data);
    });
    socket.addEventListener("close", (e) => {
      clearInterval(pinger);
      tell("switchboard:live", { open: false });
      if (e.code === 4403 || e.code === 403) {
        setLive("off", "not authorized — log in again");
        return;
      }
      if (paused) {
        setLive("off", "paused");
        return;
      }
      attempts += 1;
      const delay = Math.min(15000, 500 * 2 ** Math.min(attempts, 5));
      setLive("off", "offline — retrying in " + Math.round(delay / 1000) + "s");
      setTimeout(connect, delay);
    });
  }

  // ---------------------------------------------------------------- deciding holds
  function csrfToken() {
    const input = $('input[name="csrfmiddlewaretoken"]');
    return input ? input.value : "";
  }

  async function decide(ids, action, reason) {
    if (!ids.length) {
      notice("Select a held message first (j/k to move, x to select).", "warn");
      return;
    }
    const form = new URLSearchParams();
    ids.forEach((id) => form.append("delivery_ids", id));
    form.append("action", action);
    form.append("reason", reason || "");
    form.append("csrfmiddlewaretoken", csrfToken());
    let response;
    try {
      response = await fetch("/holds/decide", {
        method: "POST",
        credentials: "same-origin",
        headers: { Accept: "application/json", "X-CSRFToken": csrfToken() },
        body: form,
      });
    } catch (err) {
      notice("Could not reach the hub; nothing was decided. Try again.", "error");
      return;
    }
    let result = {};
    try {
      result = await response.json();
    } catch (err) {
      result = { detail: "The hub answered " + response.status + "." };
    }
    if (!response.ok) {
      notice(result.detail || "That did not work.", "error");
      return;
    }
    (result.moved || []).forEach((id) => removeHoldRow(id));
    let text = result.verb + " " + (result.moved || []).length + ".";
    if ((result.skipped || []).length) text += " " + result.skipped.length + " had already been decided or expired.";
    notice(text, "ok");
    const bulkReason = $("[data-bulk-reason]");
    if (bulkReason && ids.length > 1) bulkReason.value = "";
  }

  function selectedIds() {
    return $$('input[type=checkbox][name="delivery_ids"]:checked', holdsTable).map((c) => c.value);
  }

  function updateSelected() {
    const out = $("[data-selected-count]");
    if (out) out.textContent = selectedIds().length + " selected";
    const all = $("[data-select-all]");
    const boxes = $$('input[type=checkbox][name="delivery_ids"]', holdsTable);
    if (all) all.checked = boxes.length > 0 && boxes.every((c) => c.checked);
  }

  function current() {
    return $("tr.hold.current", holdsTable);
  }

  function setCurrent(row, focus) {
    holdRows().forEach((r) => r.classList.remove("current"));
    if (!row) return;
    row.classList.add("current");
    if (focus !== false) {
      row.focus({ preventScroll: true });
      row.scrollIntoView({ block: "nearest" });
    }
  }

  function move(step) {
    const rows = visibleHoldRows();
    if (!rows.length) return;
    const at = rows.indexOf(current());
    const next = at < 0 ? (step > 0 ? 0 : rows.length - 1) : Math.min(rows.length - 1, Math.max(0, at + step));
    setCurrent(rows[next]);
  }

  function actOnKey(action) {
    const ids = selectedIds();
    if (ids.length) {
      const reason = ($("[data-bulk-reason]") || {}).value || "";
      decide(ids, action, reason);
      return;
    }
    const row = current();
    if (!row) {
      notice("No hold is selected: press j to move to the first one.", "warn");
      return;
    }
    const rowReason = ($('input[name="reason"]', row) || {}).value || "";
    decide([row.dataset.deliveryId], action, rowReason || ($("[data-bulk-reason]") || {}).value || "");
  }

  function setUpHolds() {
    if (!holdsTable) return;
    const noticeEl = document.createElement("p");
    noticeEl.id = "notice";
    noticeEl.className = "notice";
    noticeEl.setAttribute("role", "status");
    noticeEl.setAttribute("aria-live", "polite");
    holdsTable.closest(".panel").insertBefore(noticeEl, $("#bulk"));

    // Row, group and bulk forms post through fetch, so the queue keeps its place and selection.
    // Listeners sit on the document: the queue's table is replaced when new holds are shown.
    document.addEventListener("submit", (e) => {
      const form = e.target;
      const action = e.submitter && e.submitter.value;
      if (!(form instanceof HTMLFormElement) || !action) return;
      const reason = ($('input[name="reason"]', form) || {}).value || "";
      if (form.id === "bulk") {
        e.preventDefault();
        decide(selectedIds(), action, ($("[data-bulk-reason]") || {}).value || "");
      } else if (form.hasAttribute("data-group-form") && holdsTable.contains(form)) {
        e.preventDefault();
        // The group as it is now: holds decided meanwhile have already left it.
        decide(groupIds(form.closest("tbody.hold-group")), action, reason);
      } else if (form.classList.contains("decide") && holdsTable.contains(form)) {
        e.preventDefault();
        const row = form.closest("tr.hold");
        decide([row.dataset.deliveryId], action, reason);
      }
    });
    document.addEventListener("change", (e) => {
      if (holdsTable.contains(e.target) && e.target.matches('input[type=checkbox][name="delivery_ids"]')) updateSelected();
    });
    document.addEventListener("click", (e) => {
      if (!holdsTable.contains(e.target)) return;
      const toggle = e.target.closest("[data-group-toggle]");
      if (toggle) {
        const group = toggle.closest("tbody.hold-group");
        setGroupOpen(group, group.hasAttribute("data-collapsed"));
        return;
      }
      const row = e.target.closest("tr.hold");
      if (row) setCurrent(row, false);
    });
    if (pill) pill.addEventListener("click", showNewHolds);
    const all = $("[data-select-all]");
    if (all) {
      all.addEventListener("change", () => {
        $$('input[type=checkbox][name="delivery_ids"]', holdsTable).forEach((c) => (c.checked = all.checked));
        updateSelected();
      });
    }
    const toggle = $('[data-toggle="shortcuts"]');
    const help = $("#shortcuts");
    function toggleHelp() {
      help.hidden = !help.hidden;
      toggle.setAttribute("aria-expanded", String(!help.hidden));
    }
    if (toggle && help) toggle.addEventListener("click", toggleHelp);

    document.addEventListener("keydown", (e) => {
      if (e.ctrlKey || e.metaKey || e.altKey) return;
      const typing = e.target.closest && e.target.closest("input[type=text], textarea, select");
      if (typing) {
        if (e.key === "Escape") e.target.blur();
        return;
      }
      const keys = {
        j: () => move(1),
        ArrowDown: () => move(1),
        k: () => move(-1),
        ArrowUp: () => move(-1),
        x: () => {
          const row = current();
          const box = row && $("input[type=checkbox]", row);
          if (box) {
            box.checked = !box.checked;
            updateSelected();
          }
        },
        a: () => actOnKey("approve"),
        d: () => actOnKey("deny"),
        r: () => {
          const row = current();
          const input = row && $('input[name="reason"]', row);
          if (input) input.focus();
        },
        n: () => {
          if (newHolds.size) showNewHolds();
        },
        "*": () => {
          if (all) {
            all.checked = !all.checked;
            all.dispatchEvent(new Event("change"));
          }
        },
        "?": () => toggle && help && toggleHelp(),
      };
      const run = keys[e.key];
      if (run) {
        e.preventDefault();
        run();
      }
    });
    refreshHoldsChrome();
  }

  // A reason box must never approve by accident: Enter in it would submit the form with its first
  // button (Approve). The operator picks the action with a button, or Esc and then a or d.
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || !e.target.matches || !e.target.matches('input[name="reason"]')) return;
    e.preventDefault();
    notice("Choose Approve or Deny (or press Esc, then a or d).", "warn");
  });

  // ---------------------------------------------------------------- start
  setHeldCount(heldCount());
  setUpHolds();
  tickClocks();
  tickCountdowns();
  tickAges();
  setInterval(() => {
    tickCountdowns();
    tickAges();
  }, 1000);
  setInterval(tickClocks, 5000);
  // Time alone makes a session dead or a hold expire, with no event to say so: the page asks the
  // server again now and then (the server decides; the page only shows its verdict).
  setInterval(refreshAttention, 20000);
  if ($("table[data-sessions]")) setInterval(() => catchUp(true), 30000);
  connect();

  // Exposed for tests and for a person poking at the console from the browser's devtools.
  // `pause` closes the socket without reconnecting (as a network drop would, minus the retry), and
  // `resume` reconnects and catches up; the browser test uses them to prove nothing is missed.
  window.switchboardConsole = {
    cursor: () => cursor,
    live: () => Boolean(socket) && socket.readyState === WebSocket.OPEN,
    catchUp: catchUp,
    refreshAttention: refreshAttention,
    newHolds: () => newHolds.size,
    pause: () => {
      paused = true;
      if (socket) socket.close();
    },
    resume: () => {
      if (paused) connect();
    },
  };
})();
