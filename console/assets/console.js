// Fjord console: progressive enhancement only. Every page works without this script.
"use strict";

// Filter the rows of a table by name as one types (topics, groups).
function setupFilters() {
  for (const input of document.querySelectorAll("input[data-filter]")) {
    const table = document.getElementById(input.dataset.filter);
    if (!table) continue;
    input.addEventListener("input", () => {
      const needle = input.value.toLowerCase();
      for (const row of table.tBodies[0].rows) {
        const name = (row.dataset.name || "").toLowerCase();
        row.hidden = needle !== "" && !name.includes(needle);
      }
    });
  }
}

// Ask before destructive posts (delete a topic, reset offsets).
function setupConfirms() {
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
}

// Live lag of a group over Server-Sent Events: updates the cells of the lag table.
function setupLiveLag() {
  const table = document.querySelector("table[data-stream]");
  if (!table || !window.EventSource) return;
  const status = document.createElement("span");
  status.className = "live";
  table.before(status);
  const source = new EventSource(table.dataset.stream);
  source.addEventListener("lag", (event) => {
    const doc = JSON.parse(event.data);
    const total = document.getElementById("total-lag");
    if (total) total.textContent = doc.total.toLocaleString("en-US");
    const state = document.getElementById("state");
    if (state) state.textContent = doc.state;
    for (const p of doc.partitions) {
      const row = Array.from(table.tBodies[0].rows).find((r) => r.dataset.tp === p.tp);
      if (!row) continue;
      row.querySelector(".committed").textContent = p.committed;
      row.querySelector(".end").textContent = p.end >= 0 ? p.end : "?";
      row.querySelector(".lag").textContent = p.lag;
    }
    // The chart is the server's SVG (every name in it escaped there).
    const chart = document.getElementById("lag-chart");
    if (chart && doc.chart) chart.innerHTML = doc.chart;
    status.textContent = "live · updated " + new Date().toLocaleTimeString();
  });
  source.addEventListener("failure", (event) => {
    status.textContent = "live update failed: " + event.data;
  });
}

// Live produce/consume rates on the overview over Server-Sent Events.
function setupLiveRates() {
  const summary = document.querySelector("#rates[data-stream]");
  if (!summary || !window.EventSource) return;
  const source = new EventSource(summary.dataset.stream);
  source.addEventListener("rates", (event) => {
    const doc = JSON.parse(event.data);
    document.getElementById("produce-rate").textContent = doc.produce.toFixed(1);
    document.getElementById("consume-rate").textContent = doc.consume.toFixed(1);
    const chart = document.getElementById("rates-chart");
    if (chart && doc.chart) chart.innerHTML = doc.chart;
  });
}

document.addEventListener("DOMContentLoaded", () => {
  setupFilters();
  setupConfirms();
  setupLiveLag();
  setupLiveRates();
});
