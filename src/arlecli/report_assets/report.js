(function(){
"use strict";
var data = JSON.parse(document.getElementById("report-data").textContent);
function el(tag, cls, text){var e=document.createElement(tag); if(cls){e.className=cls;}
  if(text!==undefined&&text!==null){e.textContent=String(text);} return e;}
function str(v){ if(v===null||v===undefined){return "";} return typeof v==="string"?v:JSON.stringify(v,null,1); }
function block(parent, label, value){ if(value===undefined){return;} parent.appendChild(el("div","label",label));
  parent.appendChild(el("pre","",str(value))); }
function promptText(p){ if(typeof p==="string"){return p;} if(Array.isArray(p)){return p.map(function(m){
  return "["+(m&&m.role)+"] "+str(m&&m.content);}).join("\n\n");} return str(p); }
// The fields shown in blocks of their own (report.py's BROWSER_SCHEMA); the rest are "other fields".
var KNOWN = {}; data.schema.shown.forEach(function(k){ KNOWN[k]=1; });
var TURN_SHOWN = data.schema.turn_shown;
// A turn's thinking, folded (closed <details>) above its answer, with its token count and whether it was cut.
function thinking(parent, t){ if(typeof t.thinking!=="string"){return false;}
  var about=[]; if(typeof t.thinking_tokens==="number"){about.push(t.thinking_tokens+" tokens");}
  if(t.thinking_cut){about.push("cut: no answer");}
  var d=el("details","thinking"); d.dataset.cut=t.thinking_cut?"1":"0";
  if(typeof t.thinking_tokens==="number"){d.dataset.tokens=String(t.thinking_tokens);}
  d.appendChild(el("summary","","thinking"+(about.length?" ("+about.join(", ")+")":"")));
  d.appendChild(el("pre","",t.thinking)); parent.appendChild(d); return true; }
function answer(parent, t){ var thought=thinking(parent, t);
  block(parent, thought?"answer":"completion", t.completion); }
function sampleBody(s){
  var b = el("div","body");
  block(b, "prompt", promptText(s.prompt));
  if(Array.isArray(s.turns)){
    s.turns.forEach(function(t,i){ var d=el("div","turn"); d.appendChild(el("div","label","turn "+(i+1)+
      (t.finish_reason?" ("+t.finish_reason+")":""))); answer(d,t);
      if(t.tool_calls!==undefined){block(d,"tool calls",t.tool_calls);}
      if(t.observation!==undefined&&t.observation!==null){block(d,"observation",promptText(t.observation));}
      var extra={}; Object.keys(t).forEach(function(k){ if(TURN_SHOWN.indexOf(k)<0){extra[k]=t[k];}});
      if(Object.keys(extra).length){block(d,"turn fields",extra);} b.appendChild(d); });
  } else { answer(b, s); }
  var ext = el("div","label","extracted vs target"); b.appendChild(ext);
  b.appendChild(el("pre","", "extracted: "+str(s.extracted)+"\ntarget:    "+str(s.target)));
  block(b, "reward details", s.details);
  if(s.env_info!==undefined){block(b,"environment info",s.env_info);}
  var other={}; Object.keys(s).forEach(function(k){ if(!KNOWN[k]){other[k]=s[k];}});
  block(b, "other fields", other);
  return b;
}
function buildBrowser(host, payload){
  var controls = el("div","controls");
  var sel = el("select","filter"); [["all","all"],["correct","correct"],["wrong","wrong"]].forEach(function(o){
    var op=el("option","",o[1]); op.value=o[0]; sel.appendChild(op); });
  var search = el("input","search"); search.type="search"; search.placeholder="search prompt, completion, id, target";
  var sort = el("select","sort"); [["order","in samples.jsonl order"],["task","sort by task"],
    ["reward","sort by reward (highest first)"],["latency","sort by latency (slowest first)"],
    ["length","sort by length (longest first)"]].forEach(function(o){
    var op=el("option","",o[1]); op.value=o[0]; sort.appendChild(op); });
  var shown = el("span","shown");
  controls.appendChild(sel); controls.appendChild(sort); controls.appendChild(search); controls.appendChild(shown);
  host.appendChild(controls);
  var list = el("div","sample-list"); host.appendChild(list);
  var rows = payload.samples.map(function(s){
    var d = el("details","sample"); d.dataset.correct = s.correct ? "1" : "0";
    var sm = el("summary"); sm.appendChild(el("span", s.correct?"ok":"bad", s.correct?"\u2713":"\u2717"));
    sm.appendChild(el("span","sid", s.id));
    sm.appendChild(el("span","", "reward "+(typeof s.reward==="number"?s.reward.toFixed(3):str(s.reward))+
      (s.group!==undefined&&s.group!==""?" \u00b7 "+str(s.group):"")+
      (typeof s.latency_s==="number"?" \u00b7 "+s.latency_s.toFixed(2)+" s":"")));
    // Collapsed, a row still says what was asked, what was wanted and what was read from the answer.
    sm.appendChild(el("span","question", s.question));
    var facts = el("span","facts"); facts.appendChild(el("span","label","target "));
    facts.appendChild(el("span","", str(s.target).slice(0,120)));
    facts.appendChild(el("span","label"," \u00b7 extracted "));
    facts.appendChild(el("span", s.correct?"ok":"bad",
      s.extracted===null||s.extracted===undefined ? "(none)" : str(s.extracted).slice(0,120)));
    sm.appendChild(facts);
    var last = Array.isArray(s.turns)&&s.turns.length ? s.turns[s.turns.length-1].completion : s.completion;
    if(s.thinking_cut){ sm.appendChild(el("span","cut","no answer: cut inside its thinking \u00b7 ")); }
    sm.appendChild(el("span","preview", str(last).slice(0,160)));
    d.appendChild(sm); d.appendChild(sampleBody(s)); list.appendChild(d);
    var hay = [s.id, promptText(s.prompt), str(s.completion), str(s.extracted), str(s.target), str(s.group),
      str(s.thinking)];
    if(Array.isArray(s.turns)){ s.turns.forEach(function(t){ hay.push(str(t.completion)); hay.push(str(t.observation));
      hay.push(str(t.thinking)); }); }
    return {node:d, correct:!!s.correct, hay:hay.join("\n").toLowerCase()};
  });
  function apply(){ var f=sel.value, q=search.value.toLowerCase(), n=0;
    rows.forEach(function(r){ var ok=(f==="all"||(f==="correct")===r.correct)&&(!q||r.hay.indexOf(q)>=0);
      r.node.style.display = ok ? "" : "none"; if(ok){n++;} });
    shown.textContent = "showing "+n+" of "+rows.length+(payload.omitted?" embedded ("+payload.omitted+" more left out)":""); }
  // The orders come computed with the page (report.sample_orders); sorting moves the rows.
  function reorder(){ var order = sort.value==="order" ? null : payload.orders[sort.value];
    (order || rows.map(function(_,i){return i;})).forEach(function(i){ list.appendChild(rows[i].node); }); }
  sel.addEventListener("change", apply); search.addEventListener("input", apply);
  sort.addEventListener("change", reorder); apply();
}
document.querySelectorAll("div.browser").forEach(function(host){ buildBrowser(host, data.browsers[+host.dataset.browser]); });
document.querySelectorAll("div.chart").forEach(function(div){ var fig = data.figures[+div.dataset.fig];
  Plotly.newPlot(div, fig.data, fig.layout, {displaylogo:false, responsive:true}); });
document.body.dataset.ready = "1";
})();
