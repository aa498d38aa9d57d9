"use strict";(self.rspackChunkjupyterlab_gpupool=self.rspackChunkjupyterlab_gpupool||[]).push([[232],{475(o,e,t){var r=t(601),a=t.n(r),n=t(314),i=(t.n(n))()(a());i.push([o.id,`/* Colours come from JupyterLab's theme variables, so light and dark themes both pass
   WCAG AA contrast (checked with axe-core in tests/browser/test_lab_extension.py). */
.jp-GPUPool-panel {
  background: var(--jp-layout-color1);
  color: var(--jp-ui-font-color1);
  font-size: var(--jp-ui-font-size1);
  overflow-y: auto;
  padding: 8px 12px;
  min-width: 260px;
}
.jp-GPUPool-heading { font-size: var(--jp-ui-font-size3); margin: 4px 0 8px; }
.jp-GPUPool-subheading { font-size: var(--jp-ui-font-size2); margin: 12px 0 4px; }
.jp-GPUPool-chart-title { font-size: var(--jp-ui-font-size1); margin: 8px 0 2px; font-weight: 600; }
.jp-GPUPool-device { font-size: var(--jp-ui-font-size2); font-weight: 600; margin: 2px 0; }
.jp-GPUPool-facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 8px; margin: 4px 0; }
.jp-GPUPool-facts dt { color: var(--jp-ui-font-color1); font-weight: 600; }
.jp-GPUPool-facts dd { margin: 0; overflow-wrap: anywhere; }
.jp-GPUPool-note { color: var(--jp-ui-font-color1); margin: 4px 0; }
.jp-GPUPool-message { overflow-wrap: anywhere; margin: 4px 0; }
/* Warnings and errors keep their own colours in every theme (a light card, dark text: the
   theme's warn/error tints are light in the dark theme too, so theme text on them fails) */
.jp-GPUPool-down { color: #1a1a1a; background: #ffebee; padding: 4px 6px; border-left: 4px solid #c62828; }
.jp-GPUPool-error { color: #1a1a1a; background: #ffebee; }
.jp-GPUPool-notice, .jp-GPUPool-budget-warning { border-left: 4px solid #e65100; background: #fff3e0; color: #1a1a1a; padding: 4px 8px; }
.jp-GPUPool-notice .jp-GPUPool-note, .jp-GPUPool-notice .jp-GPUPool-subheading { color: #1a1a1a; }
.jp-GPUPool-countdown { font-weight: 700; font-variant-numeric: tabular-nums; }
.jp-GPUPool-chart { width: 100%; height: 56px; display: block; }
.jp-GPUPool-chart-line { fill: none; stroke: var(--jp-brand-color1); stroke-width: 1.5; }
.jp-GPUPool-chart-axis { stroke: var(--jp-border-color1); stroke-width: 1; }
.jp-GPUPool-meter { margin: 6px 0; }
.jp-GPUPool-meter-label { display: block; font-weight: 600; }
.jp-GPUPool-meter-text { display: block; }
.jp-GPUPool-bar { height: 8px; background: var(--jp-layout-color3); border-radius: 4px; overflow: hidden; margin-top: 2px; }
.jp-GPUPool-bar-fill { height: 100%; background: var(--jp-brand-color1); }
.jp-GPUPool-choices { border: 1px solid var(--jp-border-color1); padding: 4px 8px; margin: 4px 0 8px; }
.jp-GPUPool-choice { display: flex; gap: 6px; align-items: flex-start; margin: 4px 0; }
.jp-GPUPool-choice label { display: flex; flex-direction: column; }
.jp-GPUPool-choice-detail { color: var(--jp-ui-font-color1); }
.jp-GPUPool-choice input:disabled + label { color: var(--jp-ui-font-color2); }
.jp-GPUPool-reclaims { padding-left: 16px; }
.jp-GPUPool-sr-only { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }
.jp-GPUPool-status-button { background: none; border: none; color: var(--jp-ui-font-color1); font: inherit; padding: 0 4px; cursor: pointer; height: 100%; }
.jp-GPUPool-status-button:focus-visible { outline: 2px solid var(--jp-brand-color1); }
.jp-GPUPool-status.jp-GPUPool-amber { background: #ffb74d; }
.jp-GPUPool-status.jp-GPUPool-amber .jp-GPUPool-status-button { color: #1a1a1a; font-weight: 600; }
.jp-GPUPool-status.jp-GPUPool-down { background: #ffcdd2; }
.jp-GPUPool-status.jp-GPUPool-down .jp-GPUPool-status-button { color: #1a1a1a; }
/* My jobs: one line per job, its class as a badge, its output in a scrolling box */
.jp-GPUPool-jobList { padding-left: 16px; }
.jp-GPUPool-job { margin: 4px 0; }
.jp-GPUPool-jobName { font-weight: 600; }
.jp-GPUPool-jobClass { padding: 0 6px; border-radius: 8px; font-size: var(--jp-ui-font-size0); background: var(--jp-layout-color2); }
.jp-GPUPool-jobState { color: var(--jp-ui-font-color2); }
.jp-GPUPool-jobLogText { max-height: 240px; overflow: auto; white-space: pre-wrap; background: var(--jp-layout-color2); padding: 4px; font-family: var(--jp-code-font-family); font-size: var(--jp-code-font-size); }
.jp-GPUPool-job .jp-Button { height: 22px; line-height: 20px; padding: 0 8px; margin-left: 4px; font-size: var(--jp-ui-font-size0); }
`,""]),t.d(e,{},{A:i})},314(o){o.exports=function(o){var e=[];return e.toString=function(){return this.map(function(e){var t="",r=void 0!==e[5];return e[4]&&(t+="@supports (".concat(e[4],") {")),e[2]&&(t+="@media ".concat(e[2]," {")),r&&(t+="@layer".concat(e[5].length>0?" ".concat(e[5]):""," {")),t+=o(e),r&&(t+="}"),e[2]&&(t+="}"),e[4]&&(t+="}"),t}).join("")},e.i=function(o,t,r,a,n){"string"==typeof o&&(o=[[null,o,void 0]]);var i={};if(r)for(var p=0;p<this.length;p++){var l=this[p][0];null!=l&&(i[l]=!0)}for(var s=0;s<o.length;s++){var c=[].concat(o[s]);r&&i[c[0]]||(void 0!==n&&(void 0===c[5]||(c[1]="@layer".concat(c[5].length>0?" ".concat(c[5]):""," {").concat(c[1],"}")),c[5]=n),t&&(c[2]&&(c[1]="@media ".concat(c[2]," {").concat(c[1],"}")),c[2]=t),a&&(c[4]?(c[1]="@supports (".concat(c[4],") {").concat(c[1],"}"),c[4]=a):c[4]="".concat(a)),e.push(c))}},e}},601(o){o.exports=function(o){return o[1]}},72(o){var e=[];function t(o){for(var t=-1,r=0;r<e.length;r++)if(e[r].identifier===o){t=r;break}return t}function r(o,r){for(var a={},n=[],i=0;i<o.length;i++){var p=o[i],l=r.base?p[0]+r.base:p[0],s=a[l]||0,c="".concat(l," ").concat(s);a[l]=s+1;var u=t(c),d={css:p[1],media:p[2],sourceMap:p[3],supports:p[4],layer:p[5]};if(-1!==u)e[u].references++,e[u].updater(d);else{var f=function(o,e){var t=e.domAPI(e);return t.update(o),function(e){e?(e.css!==o.css||e.media!==o.media||e.sourceMap!==o.sourceMap||e.supports!==o.supports||e.layer!==o.layer)&&t.update(o=e):t.remove()}}(d,r);r.byIndex=i,e.splice(i,0,{identifier:c,updater:f,references:1})}n.push(c)}return n}o.exports=function(o,a){var n=r(o=o||[],a=a||{});return function(o){o=o||[];for(var i=0;i<n.length;i++){var p=t(n[i]);e[p].references--}for(var l=r(o,a),s=0;s<n.length;s++){var c=t(n[s]);0===e[c].references&&(e[c].updater(),e.splice(c,1))}n=l}}},659(o){var e={};o.exports=function(o,t){var r=function(o){if(void 0===e[o]){var t=document.querySelector(o);if(window.HTMLIFrameElement&&t instanceof window.HTMLIFrameElement)try{t=t.contentDocument.head}catch(o){t=null}e[o]=t}return e[o]}(o);if(!r)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");r.appendChild(t)}},540(o){o.exports=function(o){var e=document.createElement("style");return o.setAttributes(e,o.attributes),o.insert(e,o.options),e}},56(o,e,t){o.exports=function(o){var e=t.nc;e&&o.setAttribute("nonce",e)}},206(o){o.exports=function(o){if("u"<typeof document)return{update:function(){},remove:function(){}};var e=o.insertStyleElement(o);return{update:function(t){var r,a,n;r="",t.supports&&(r+="@supports (".concat(t.supports,") {")),t.media&&(r+="@media ".concat(t.media," {")),(a=void 0!==t.layer)&&(r+="@layer".concat(t.layer.length>0?" ".concat(t.layer):""," {")),r+=t.css,a&&(r+="}"),t.media&&(r+="}"),t.supports&&(r+="}"),(n=t.sourceMap)&&"u">typeof btoa&&(r+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(n))))," */")),o.styleTagTransform(r,e,o.options)},remove:function(){var o;null===(o=e).parentNode||o.parentNode.removeChild(o)}}}},113(o){o.exports=function(o,e){if(e.styleSheet)e.styleSheet.cssText=o;else{for(;e.firstChild;)e.removeChild(e.firstChild);e.appendChild(document.createTextNode(o))}}},579(o,e,t){var r=t(72),a=t.n(r),n=t(206),i=t.n(n),p=t(659),l=t.n(p),s=t(56),c=t.n(s),u=t(540),d=t.n(u),f=t(113),P=t.n(f),h=t(475),j={};j.styleTagTransform=P(),j.setAttributes=c(),j.insert=l().bind(null,"head"),j.domAPI=i(),j.insertStyleElement=d(),a()(h.A,j),h.A&&h.A.locals&&h.A.locals}}]);