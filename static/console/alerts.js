// Switchboard console: browser notifications for new escalated holds, for an operator who asked.
//
// Opt-in: a "Notify me" button in the header asks the browser's permission; the choice is kept in
// this browser (localStorage). While it is on, this script hears the events of the console's live
// socket (console.js passes each on as a `switchboard:event` on the document) and shows one
// notification per new hold that
// needs a human (escalate=required). A notification names the sessions and what matched, never
// the message's text; clicking it opens the hold's page, where the operator can acknowledge it.
(() => {
  "use strict";
  const KEY = "switchboard.notify";
  const body = document.body;
  const header = document.querySelector("header.top");
  if (!body || !body.dataset.wsPath || !header || !("Notification" in window)) return;

  let socketOpen = Boolean(window.switchboardConsole && window.switchboardConsole.live());
  const button = document.createElement("button");
  button.type = "button";
  button.className = "link";
  button.id = "notify-toggle";

  const wanted = () => localStorage.getItem(KEY) === "on";
  const enabled = () => wanted() && Notification.permission === "granted";

  function render() {
    const blocked = Notification.permission === "denied";
    button.disabled = blocked;
    button.setAttribute("aria-pressed", enabled() ? "true" : "false");
    button.textContent = blocked ? "Notifications blocked" : enabled() ? "Notifications on" : "Notify me";
    button.title = blocked
      ? "This browser blocks notifications from the console; allow them in its site settings."
      : enabled()
        ? "Escalated holds show as notifications. Click to stop."
        : "Show a notification when a hold needs a human, even when this tab is in the background.";
    if (enabled() && socketOpen) button.dataset.listening = "on";
    else delete button.dataset.listening;
  }

  function label(who) {
    return who ? who.name + " [" + who.ref + "]" : "the hub";
  }

  function show(d) {
    const matched = Array.isArray(d.matched) && d.matched.length ? d.matched.join(", ") : "escalated";
    const note = new Notification("Hold needs a human: " + label(d.to), {
      body: label(d.from) + " → " + label(d.to) + " · " + matched,
      tag: "switchboard-hold-" + d.delivery_id, // one per hold, however many tabs show it
    });
    note.addEventListener("click", () => {
      window.focus();
      location.href = "/alerts/holds/" + encodeURIComponent(String(d.delivery_id)) + "/";
      note.close();
    });
  }

  function heard(kind, d) {
    if (kind === "message.sent" && d && d.state === "held" && d.escalate === "required") show(d);
  }

  document.addEventListener("switchboard:live", (e) => {
    socketOpen = e.detail.open;
    render();
  });
  document.addEventListener("switchboard:event", (e) => {
    if (enabled()) heard(e.detail.kind, e.detail.data);
  });

  button.addEventListener("click", async () => {
    if (enabled()) {
      localStorage.setItem(KEY, "off");
      render();
      return;
    }
    const answer = await Notification.requestPermission();
    if (answer === "granted") localStorage.setItem(KEY, "on");
    render();
  });

  const live = header.querySelector("#live");
  if (live) live.after(button);
  else header.append(button);
  render();
})();
