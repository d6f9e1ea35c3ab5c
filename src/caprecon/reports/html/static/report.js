// caprecon report: sortable and filterable tables, and the gallery drawn page by page from
// the JSON blob in #gallery-data. Text from the data only ever reaches the page through
// textContent or attribute setters, never as markup.
(function () {
  "use strict";

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function fmt(value) {
    return value === null || value === undefined ? "–" : Number(value).toFixed(4);
  }

  // ------------------------------------------------------------------ tables
  function cellKey(cell) {
    var v = cell ? cell.getAttribute("data-v") : null;
    if (v !== null && v !== "" && !isNaN(parseFloat(v))) return parseFloat(v);
    var text = cell ? cell.textContent.trim() : "";
    return text === "" || text === "–" ? null : text.toLowerCase();
  }

  function compareKeys(a, b) {
    if (a === b) return 0;
    if (a === null) return 1; // empty cells last, whatever the direction
    if (b === null) return -1;
    if (typeof a === typeof b) return a < b ? -1 : 1;
    return typeof a === "number" ? -1 : 1;
  }

  function sortTable(table, column, header) {
    var ascending = header.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("thead th").forEach(function (th) { th.removeAttribute("aria-sort"); });
    header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r, s) {
      var a = cellKey(r.cells[column]), b = cellKey(s.cells[column]);
      if (a === null || b === null) return compareKeys(a, b);
      return compareKeys(a, b) * (ascending ? 1 : -1);
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("thead th").forEach(function (th, column) {
      th.tabIndex = 0;
      th.title = "sort";
      th.addEventListener("click", function () { sortTable(table, column, th); });
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sortTable(table, column, th); });
    });
  });

  document.querySelectorAll("input[data-filter]").forEach(function (input) {
    var table = document.getElementById(input.getAttribute("data-filter"));
    if (!table) return;
    input.addEventListener("input", function () {
      var query = input.value.toLowerCase();
      Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
        row.hidden = query !== "" && row.textContent.toLowerCase().indexOf(query) < 0;
      });
    });
  });

  // ------------------------------------------------------------------ pages of cards
  function pager(container, page, pages, go) {
    container.textContent = "";
    function button(label, target, disabled) {
      var b = el("button", null, label);
      b.type = "button";
      b.disabled = disabled;
      b.addEventListener("click", function () { go(target); });
      container.appendChild(b);
    }
    button("«", 0, page === 0);
    button("‹", page - 1, page === 0);
    container.appendChild(el("span", "page", "page " + (pages ? page + 1 : 0) + " of " + pages));
    button("›", page + 1, page >= pages - 1);
    button("»", pages - 1, page >= pages - 1);
  }

  // ------------------------------------------------------------------ question bank
  // a CTTD build: one card per image with its questions, filtered by category, type and text
  (function bank() {
    var blob = document.getElementById("bank-data");
    if (!blob) return;
    var data = JSON.parse(blob.textContent);
    var state = { category: "", type: "", query: "", page: 0, size: data.page_size };
    var category = document.getElementById("bank-category");
    var type = document.getElementById("bank-type");
    var query = document.getElementById("bank-filter");
    var list = document.getElementById("bank-items");
    var count = document.getElementById("bank-count");
    var pagers = document.querySelectorAll(".bank-pager");
    var total = 0;
    data.images.forEach(function (image) { total += image.q.length; });

    function options(select, names) {
      names.forEach(function (name) {
        var option = el("option", null, name);
        option.value = name;
        select.appendChild(option);
      });
    }
    options(category, data.categories);
    options(type, data.types);

    function matches(q) {
      if (state.category && q.c !== state.category) return false;
      if (state.type && q.t !== state.type) return false;
      return true;
    }

    function card(image, questions) {
      var article = el("article", "card bank-card");
      article.setAttribute("data-id", image.im);
      var fig = el("figure");
      if (image.o) {
        var img = el("img");
        img.loading = "lazy";
        img.decoding = "async";
        img.alt = "image " + image.im;
        img.src = data.thumbs + image.o;
        fig.appendChild(img);
      } else {
        fig.appendChild(el("div", "noimage", "no image"));
      }
      fig.appendChild(el("figcaption", null, image.im));
      article.appendChild(fig);
      var text = el("div", "text");
      var about = [questions.length + (questions.length > 1 ? " questions" : " question")];
      if (image.source) about.push(image.source);
      if (image.src) about.push(image.src);
      text.appendChild(el("p", "about", about.join(" · ")));
      var ol = el("ol", "questions");
      questions.forEach(function (q) {
        var li = el("li");
        li.setAttribute("data-category", q.c);
        li.setAttribute("data-type", q.t);
        li.appendChild(el("span", "question", q.q));
        li.appendChild(el("span", "category", q.c + " · " + q.t));
        if (q.ch) li.appendChild(el("span", "choices", q.ch.map(function (c, k) {
          return String.fromCharCode(65 + k) + ". " + c;
        }).join("   ")));
        li.appendChild(el("span", "expected", "answer: " + q.a + (q.co ? " (" + q.co + " coordinates)" : "")));
        ol.appendChild(li);
      });
      text.appendChild(ol);
      article.appendChild(text);
      return article;
    }

    function draw() {
      var needle = state.query.toLowerCase(), shown = [], questions = 0;
      data.images.forEach(function (image) {
        var chosen = image.q.filter(function (q) {
          if (!matches(q)) return false;
          if (!needle) return true;
          return (q.q + "\n" + q.a + "\n" + (q.ch || []).join("\n") + "\n" + image.im + "\n" + (image.src || ""))
            .toLowerCase().indexOf(needle) >= 0;
        });
        if (chosen.length) { shown.push([image, chosen]); questions += chosen.length; }
      });
      var pages = Math.ceil(shown.length / state.size);
      state.page = Math.max(0, Math.min(state.page, pages - 1));
      var fragment = document.createDocumentFragment();
      shown.slice(state.page * state.size, (state.page + 1) * state.size).forEach(function (pair) {
        fragment.appendChild(card(pair[0], pair[1]));
      });
      list.textContent = "";
      list.appendChild(fragment);
      count.textContent = questions + " of " + total + " questions, " + shown.length + " of " + data.images.length +
        " images";
      pagers.forEach(function (p) { pager(p, state.page, pages, function (target) { state.page = target; draw(); }); });
    }

    category.addEventListener("change", function () { state.category = category.value; state.page = 0; draw(); });
    type.addEventListener("change", function () { state.type = type.value; state.page = 0; draw(); });
    query.addEventListener("input", function () { state.query = query.value; state.page = 0; draw(); });
    draw();
  })();

  // ------------------------------------------------------------------ gallery
  var blob = document.getElementById("gallery-data");
  if (!blob) return;
  var data = JSON.parse(blob.textContent);
  var items = data.items, metrics = data.metrics, lowerBetter = data.lower_is_better;

  // a row's values come as arrays aligned to name lists the rows share
  function named(fields, row) {
    var out = {};
    fields.forEach(function (name, k) { out[name] = row[k]; });
    return out;
  }

  // a card's list shown open under its summary line; `fill` puts one row's spans in its <li>
  function openList(className, summary, rows, fill) {
    var details = el("details", className);
    details.open = true;
    details.appendChild(el("summary", null, summary));
    var list = el("ul");
    rows.forEach(function (row) {
      var li = el("li");
      fill(li, row);
      list.appendChild(li);
    });
    details.appendChild(list);
    return details;
  }

  // a claim's answers on the photo and on the reconstruction, in words
  function claimAnswers(c) {
    function on(p, gated) { return gated ? "not asked (a claim it depends on is false)" : "P(yes) " + fmt(p); }
    return "on the original: " + on(c.pi, c.gi) + "; on the reconstruction: " + on(c.pr, c.gr);
  }

  function markedCaption(item) {
    var p = el("p", "caption");
    var caption = item.c || "";
    var end = caption.length;
    if (item.cut) {
      // tokens_cut counts the text encoder's tokens; word and punctuation pieces stand in for them
      var pieces = [], re = /[\w]+|[^\w\s]/g, m;
      while ((m = re.exec(caption)) !== null) pieces.push(m.index);
      end = pieces.length > item.cut ? pieces[pieces.length - item.cut] : 0;
    }
    // each unsupported claim's words in the caption, the first place they occur and overlap no other mark
    var marks = [], lower = caption.toLowerCase();
    (item.h || []).forEach(function (h) {
      var span = h.span.toLowerCase(), from = 0, at;
      if (!span) return;
      while ((at = lower.indexOf(span, from)) >= 0) {
        var stop = at + span.length;
        if (stop <= end && !marks.some(function (k) { return at < k.stop && k.start < stop; })) {
          marks.push({ start: at, stop: stop, h: h });
          return;
        }
        from = at + 1;
      }
    });
    // the claims metric's claims at their own offsets, where they overlap no mark already placed
    (item.cl || []).forEach(function (c) {
      if (c.s === null || c.e > end) return;
      if (marks.some(function (k) { return c.s < k.stop && k.start < c.e; })) return;
      marks.push({ start: c.s, stop: c.e, c: c });
    });
    marks.sort(function (a, b) { return a.start - b.start; });
    var done = 0;
    marks.forEach(function (k) {
      p.appendChild(document.createTextNode(caption.slice(done, k.start)));
      var mark;
      if (k.c) {
        mark = el("mark", "claim " + k.c.st, caption.slice(k.start, k.stop));
        mark.title = k.c.claim + " (" + k.c.type + ", " + k.c.st + "): " + k.c.q + " " + claimAnswers(k.c);
      } else {
        mark = el("mark", "halluc", caption.slice(k.start, k.stop));
        mark.title = k.h.claim + " (" + k.h.type + "): " + (k.h.g ? "not asked, a claim it depends on is false"
          : "P(yes) " + fmt(k.h.p) + " on the original");
      }
      p.appendChild(mark);
      done = k.stop;
    });
    p.appendChild(document.createTextNode(caption.slice(done, end)));
    if (end < caption.length) {
      var cut = el("mark", "cut", caption.slice(end));
      cut.title = "about " + item.cut + " tokens past the text encoder's limit: the generator never read them " +
        "(marked by word, approximately)";
      p.appendChild(cut);
    }
    return p;
  }

  function figure(thumb, label) {
    var fig = el("figure");
    if (thumb) {
      var img = el("img");
      img.loading = "lazy";
      img.decoding = "async";
      img.alt = label;
      img.src = data.thumbs + thumb;
      fig.appendChild(img);
    } else {
      fig.appendChild(el("div", "noimage", "no image"));
    }
    fig.appendChild(el("figcaption", null, label));
    return fig;
  }

  function card(item) {
    var article = el("article", "card" + (item.e ? " failed" : "") + (item.sel ? " selected" : ""));
    article.setAttribute("data-id", item.i);
    var images = el("div", "images");
    images.appendChild(figure(item.o, "original"));
    (item.r.length ? item.r : [null]).forEach(function (src, k) {
      images.appendChild(figure(src, item.r.length > 1 ? "reconstruction " + (k + 1) : "reconstruction"));
    });
    article.appendChild(images);
    var text = el("div", "text");
    text.appendChild(markedCaption(item));
    var about = [item.i];
    if (item.im && item.im !== item.i) about.push("image " + item.im);
    if (item.g && item.g !== "all") about.push(item.g);
    if (item.k !== undefined) about.push("candidate " + item.k);
    if (item.src) about.push(item.src);
    text.appendChild(el("p", "about", about.join(" · ")));
    if (item.sel) text.appendChild(el("p", "badge", "selected"));
    var scores = el("dl", "scores");
    metrics.forEach(function (name, k) {
      if (item.s[k] === null) return;
      scores.appendChild(el("dt", null, name));
      var ci = item.ci && item.ci[k];
      scores.appendChild(el("dd", null, fmt(item.s[k]) + (ci ? " [" + fmt(ci[0]) + ", " + fmt(ci[1]) + "]" : "")));
    });
    text.appendChild(scores);
    if (item.x) {
      var more = el("details", "more");
      more.appendChild(el("summary", null, "per category"));
      more.appendChild(el("p", null, data.other.map(function (name, k) {
        return item.x[k] === null ? null : name + " " + fmt(item.x[k]);
      }).filter(function (text) { return text !== null; }).join(", ")));
      text.appendChild(more);
    }
    if (item.f && item.f.length) {
      text.appendChild(openList("flips", item.f.length + (item.f.length > 1 ? " questions" : " question") +
        " right on the original, wrong on the reconstruction", item.f, function (li, row) {
        var f = named(data.flip_fields, row);
        li.appendChild(el("span", "question", f.question));
        if (f.category) li.appendChild(el("span", "category", f.category));
        li.appendChild(el("span", "expected", "answer: " + f.answer));
        li.appendChild(el("span", "right", "on the original: " + f.on_original));
        li.appendChild(el("span", "wrong", "on the reconstruction: " + f.on_reconstruction));
      }));
    }
    if (item.h && item.h.length) {
      text.appendChild(openList("flips halluc", item.h.length + (item.h.length > 1 ? " claims" : " claim") +
        " not supported by the original", item.h, function (li, h) {
        li.appendChild(el("span", "question", h.claim));
        li.appendChild(el("span", "category", h.type));
        li.appendChild(el("span", "wrong", h.g ? "not asked: a claim it depends on is false"
          : "P(yes) on the original: " + fmt(h.p)));
      }));
    }
    if (item.why) text.appendChild(el("p", "rationale", item.why));
    if (item.cl && item.cl.length) {
      text.appendChild(openList("claims", item.cl.length + (item.cl.length > 1 ? " claims" : " claim") +
        " checked on the original and on the reconstruction", item.cl, function (li, c) {
        li.className = c.st;
        li.appendChild(el("span", "status", c.st));
        li.appendChild(el("span", "question", c.q));
        li.appendChild(el("span", "category", c.type));
        li.appendChild(el("span", "answers", claimAnswers(c)));
        if (c.s === null) li.appendChild(el("span", "unlocated", "its words are not in the caption: " + c.span));
      }));
    }
    if (item.e) text.appendChild(el("p", "error", item.e));
    article.appendChild(text);
    return article;
  }

  var state = { sort: metrics.length ? 0 : -1, worstFirst: true, query: "", group: "", errorsOnly: false,
                selectedOnly: false, hallucOnly: false, page: 0, size: data.page_size };
  var sortSelect = document.getElementById("gallery-sort");
  var groupSelect = document.getElementById("gallery-group");
  var query = document.getElementById("gallery-filter");
  var direction = document.getElementById("gallery-dir");
  var errorsOnly = document.getElementById("gallery-errors");
  var selectedOnly = document.getElementById("gallery-selected");
  var hallucOnly = document.getElementById("gallery-halluc");
  var list = document.getElementById("gallery-items");
  var count = document.getElementById("gallery-count");
  var pagers = document.querySelectorAll(".gallery-pager");

  metrics.forEach(function (name, k) {
    var option = el("option", null, name);
    option.value = String(k);
    sortSelect.appendChild(option);
  });
  var byId = el("option", null, "id");
  byId.value = "-1";
  sortSelect.appendChild(byId);
  sortSelect.value = String(state.sort);
  data.groups.forEach(function (name) {
    var option = el("option", null, name);
    option.value = name;
    groupSelect.appendChild(option);
  });
  groupSelect.parentNode.hidden = data.groups.length < 2;

  function view() {
    var q = state.query.toLowerCase();
    var chosen = items.filter(function (item) {
      if (state.group && item.g !== state.group) return false;
      if (state.errorsOnly && !item.e) return false;
      if (state.selectedOnly && !item.sel) return false;
      if (state.hallucOnly && !(item.h && item.h.length) &&
          !(item.cl || []).some(function (c) { return c.st === "hallucinated"; })) return false;
      if (!q) return true;
      return ((item.c || "") + "\n" + item.i + "\n" + (item.g || "") + "\n" + (item.src || "")).toLowerCase().indexOf(q) >= 0;
    });
    var k = state.sort;
    // worst first: ascending unless the score is one where smaller is better
    var sign = (k >= 0 && lowerBetter.indexOf(metrics[k]) >= 0 ? -1 : 1) * (state.worstFirst ? 1 : -1);
    chosen.sort(function (a, b) {
      var x = k >= 0 ? a.s[k] : a.i, y = k >= 0 ? b.s[k] : b.i;
      if (x === y) return 0;
      if (x === null) return 1; // rows without this score (errors) go last
      if (y === null) return -1;
      return (x < y ? -1 : 1) * sign;
    });
    return chosen;
  }

  function draw() {
    var chosen = view();
    var pages = Math.ceil(chosen.length / state.size);
    state.page = Math.max(0, Math.min(state.page, pages - 1));
    var fragment = document.createDocumentFragment();
    chosen.slice(state.page * state.size, (state.page + 1) * state.size).forEach(function (item) {
      fragment.appendChild(card(item));
    });
    list.textContent = "";
    list.appendChild(fragment);
    count.textContent = chosen.length + " of " + items.length + " samples";
    direction.textContent = state.worstFirst ? "worst first" : "best first";
    pagers.forEach(function (p) { pager(p, state.page, pages, function (target) { state.page = target; draw(); }); });
  }

  sortSelect.addEventListener("change", function () { state.sort = parseInt(sortSelect.value, 10); state.page = 0; draw(); });
  direction.addEventListener("click", function () { state.worstFirst = !state.worstFirst; state.page = 0; draw(); });
  groupSelect.addEventListener("change", function () { state.group = groupSelect.value; state.page = 0; draw(); });
  query.addEventListener("input", function () { state.query = query.value; state.page = 0; draw(); });
  errorsOnly.addEventListener("change", function () { state.errorsOnly = errorsOnly.checked; state.page = 0; draw(); });
  if (selectedOnly) selectedOnly.addEventListener("change", function () {
    state.selectedOnly = selectedOnly.checked; state.page = 0; draw();
  });
  if (hallucOnly) hallucOnly.addEventListener("change", function () {
    state.hallucOnly = hallucOnly.checked; state.page = 0; draw();
  });
  draw();
  performance.mark("gallery-drawn"); // benchmarks/report.py reads when the first page was ready

  // ------------------------------------------------------------------ best-of-N
  var pools = document.getElementById("pools");
  if (!pools) return;
  var selectionIndex = metrics.indexOf(data.selection_metric);
  var byImage = {}, order = [];
  items.forEach(function (item) {
    if (item.k === undefined) return;
    if (!byImage[item.im]) { byImage[item.im] = []; order.push(item.im); }
    byImage[item.im].push(item);
  });
  var poolState = { page: 0, size: 10 };
  var poolPagers = document.querySelectorAll(".pool-pager");

  function pool(image) {
    var candidates = byImage[image].slice().sort(function (a, b) { return a.k - b.k; });
    var section = el("section", "pool");
    section.appendChild(el("h3", null, "image " + image + " · " + candidates.length + " candidates"));
    var row = el("div", "candidates");
    row.appendChild(figure(candidates[0].o, "original"));
    candidates.forEach(function (c) {
      var box = el("div", "candidate" + (c.sel ? " selected" : ""));
      box.appendChild(figure(c.r[0] || null, "candidate " + c.k + (c.sel ? " · selected" : "")));
      if (selectionIndex >= 0) box.appendChild(el("p", "score", data.selection_metric + " " + fmt(c.s[selectionIndex])));
      box.appendChild(markedCaption(c));
      row.appendChild(box);
    });
    section.appendChild(row);
    return section;
  }

  function drawPools() {
    var pages = Math.ceil(order.length / poolState.size);
    var fragment = document.createDocumentFragment();
    order.slice(poolState.page * poolState.size, (poolState.page + 1) * poolState.size).forEach(function (image) {
      fragment.appendChild(pool(image));
    });
    pools.textContent = "";
    pools.appendChild(fragment);
    poolPagers.forEach(function (p) {
      pager(p, poolState.page, pages, function (target) { poolState.page = target; drawPools(); });
    });
  }
  drawPools();
})();
