"use strict";(self.rspackChunkjupyterlab_gpupool=self.rspackChunkjupyterlab_gpupool||[]).push([[232],{475(o,r,t){var e=t(601),n=t.n(e),a=t(314),i=(t.n(a))()(n());i.push([o.id,`/* Colours come from JupyterLab's theme variables, so light and dark themes both pass
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
.jp-GPUPool-down { color: var(--jp-ui-font-color0); background: var(--jp-error-color3); padding: 4px 6px; border-left: 4px solid var(--jp-error-color1); }
.jp-GPUPool-error { color: var(--jp-ui-font-color0); background: var(--jp-error-color3); }
.jp-GPUPool-notice { border-left: 4px solid var(--jp-warn-color1); background: var(--jp-warn-color3); color: var(--jp-ui-font-color0); padding: 4px 8px; }
.jp-GPUPool-notice .jp-GPUPool-note { color: var(--jp-ui-font-color0); }
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
.jp-GPUPool-status.jp-GPUPool-amber { background: var(--jp-warn-color3); }
.jp-GPUPool-status.jp-GPUPool-amber .jp-GPUPool-status-button { color: var(--jp-ui-font-color0); font-weight: 600; }
.jp-GPUPool-status.jp-GPUPool-down .jp-GPUPool-status-button { color: var(--jp-ui-font-color0); }
`,""]),t.d(r,{},{A:i})},314(o){o.exports=function(o){var r=[];return r.toString=function(){return this.map(function(r){var t="",e=void 0!==r[5];return r[4]&&(t+="@supports (".concat(r[4],") {")),r[2]&&(t+="@media ".concat(r[2]," {")),e&&(t+="@layer".concat(r[5].length>0?" ".concat(r[5]):""," {")),t+=o(r),e&&(t+="}"),r[2]&&(t+="}"),r[4]&&(t+="}"),t}).join("")},r.i=function(o,t,e,n,a){"string"==typeof o&&(o=[[null,o,void 0]]);var i={};if(e)for(var p=0;p<this.length;p++){var l=this[p][0];null!=l&&(i[l]=!0)}for(var c=0;c<o.length;c++){var s=[].concat(o[c]);e&&i[s[0]]||(void 0!==a&&(void 0===s[5]||(s[1]="@layer".concat(s[5].length>0?" ".concat(s[5]):""," {").concat(s[1],"}")),s[5]=a),t&&(s[2]&&(s[1]="@media ".concat(s[2]," {").concat(s[1],"}")),s[2]=t),n&&(s[4]?(s[1]="@supports (".concat(s[4],") {").concat(s[1],"}"),s[4]=n):s[4]="".concat(n)),r.push(s))}},r}},601(o){o.exports=function(o){return o[1]}},72(o){var r=[];function t(o){for(var t=-1,e=0;e<r.length;e++)if(r[e].identifier===o){t=e;break}return t}function e(o,e){for(var n={},a=[],i=0;i<o.length;i++){var p=o[i],l=e.base?p[0]+e.base:p[0],c=n[l]||0,s="".concat(l," ").concat(c);n[l]=c+1;var u=t(s),d={css:p[1],media:p[2],sourceMap:p[3],supports:p[4],layer:p[5]};if(-1!==u)r[u].references++,r[u].updater(d);else{var f=function(o,r){var t=r.domAPI(r);return t.update(o),function(r){r?(r.css!==o.css||r.media!==o.media||r.sourceMap!==o.sourceMap||r.supports!==o.supports||r.layer!==o.layer)&&t.update(o=r):t.remove()}}(d,e);e.byIndex=i,r.splice(i,0,{identifier:s,updater:f,references:1})}a.push(s)}return a}o.exports=function(o,n){var a=e(o=o||[],n=n||{});return function(o){o=o||[];for(var i=0;i<a.length;i++){var p=t(a[i]);r[p].references--}for(var l=e(o,n),c=0;c<a.length;c++){var s=t(a[c]);0===r[s].references&&(r[s].updater(),r.splice(s,1))}a=l}}},659(o){var r={};o.exports=function(o,t){var e=function(o){if(void 0===r[o]){var t=document.querySelector(o);if(window.HTMLIFrameElement&&t instanceof window.HTMLIFrameElement)try{t=t.contentDocument.head}catch(o){t=null}r[o]=t}return r[o]}(o);if(!e)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");e.appendChild(t)}},540(o){o.exports=function(o){var r=document.createElement("style");return o.setAttributes(r,o.attributes),o.insert(r,o.options),r}},56(o,r,t){o.exports=function(o){var r=t.nc;r&&o.setAttribute("nonce",r)}},206(o){o.exports=function(o){if("u"<typeof document)return{update:function(){},remove:function(){}};var r=o.insertStyleElement(o);return{update:function(t){var e,n,a;e="",t.supports&&(e+="@supports (".concat(t.supports,") {")),t.media&&(e+="@media ".concat(t.media," {")),(n=void 0!==t.layer)&&(e+="@layer".concat(t.layer.length>0?" ".concat(t.layer):""," {")),e+=t.css,n&&(e+="}"),t.media&&(e+="}"),t.supports&&(e+="}"),(a=t.sourceMap)&&"u">typeof btoa&&(e+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(a))))," */")),o.styleTagTransform(e,r,o.options)},remove:function(){var o;null===(o=r).parentNode||o.parentNode.removeChild(o)}}}},113(o){o.exports=function(o,r){if(r.styleSheet)r.styleSheet.cssText=o;else{for(;r.firstChild;)r.removeChild(r.firstChild);r.appendChild(document.createTextNode(o))}}},579(o,r,t){var e=t(72),n=t.n(e),a=t(206),i=t.n(a),p=t(659),l=t.n(p),c=t(56),s=t.n(c),u=t(540),d=t.n(u),f=t(113),P=t.n(f),v=t(475),h={};h.styleTagTransform=P(),h.setAttributes=s(),h.insert=l().bind(null,"head"),h.domAPI=i(),h.insertStyleElement=d(),n()(v.A,h),v.A&&v.A.locals&&v.A.locals}}]);