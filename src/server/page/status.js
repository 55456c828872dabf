'use strict';
const parts=[['vision','#4e79a7'],['llm','#f28e2b'],['action_context','#e15759'],['action_step','#76b7b2'],['transfer','#59a14f'],['host','#edc948']];
const FAIL='#d62728';
const NS='http://www.w3.org/2000/svg';
function el(tag,attrs,text){const e=tag.startsWith('svg:')?document.createElementNS(NS,tag.slice(4)):document.createElement(tag);for(const k in attrs)e.setAttribute(k,attrs[k]);if(text!==undefined)e.textContent=String(text);return e}
function niceTicks(max,n){n=n||5;if(!(max>0))max=1;const raw=max/n,mag=Math.pow(10,Math.floor(Math.log10(raw)));let step=10*mag;for(const m of [1,2,5])if(m*mag>=raw*(1-1e-12)){step=m*mag;break}
 const k=Math.max(1,Math.ceil(max/step*(1-1e-12))),dec=Math.max(0,-Math.floor(Math.log10(step)+1e-9)),labels=[];
 for(let i=0;i<=k;i++)labels.push((i*step).toFixed(dec));return {step:step,top:k*step,labels:labels}}
function ms(v){return v>=100?v.toFixed(0):v>=10?v.toFixed(1):v.toFixed(2)}
function bytes(b){return b>=1<<30?(b/(1<<30)).toFixed(1)+' GiB':b>=1<<20?(b/(1<<20)).toFixed(1)+' MiB':(b/1024).toFixed(1)+' KiB'}
function dtypes(c){const b=c.bytes||{},ks=Object.keys(b);if(!ks.length)return 'unknown';let t=0;ks.forEach(k=>t+=b[k]);return ks.map(k=>ks.length>1?k+' '+(100*b[k]/t).toFixed(b[k]/t<0.01?1:0)+'%':k).join(', ')+' ('+bytes(t)+')'}
function rows(id,list){const tb=document.querySelector('#'+id+' tbody');tb.replaceChildren();list.forEach(r=>{const tr=el('tr');r.forEach((v,i)=>tr.append(el('td',i&&id!=='precision'?{class:'n'}:{},v)));tb.append(tr)})}
function draw(s){
 const info=document.getElementById('info');info.replaceChildren();
 [['model',s.model],['variant',s.variant],['mode',s.mode],['uptime',s.uptime_s.toFixed(0)+' s'],['requests served',s.requests_served],['requests failed',s.requests_failed+(Object.keys(s.failures).length?' ('+Object.keys(s.failures).map(k=>k+' '+s.failures[k]).join(', ')+')':'')],['clients',s.clients],['version',s.version]].forEach(r=>{const tr=el('tr');tr.append(el('td',{class:'k'},r[0]),el('td',{},r[1]));info.append(tr)});
 rows('precision',s.components.map(c=>[c.name,c.precision,dtypes(c)]));
 document.getElementById('pct-title').textContent='Percentiles over the last '+s.percentiles_over+' successful request'+(s.percentiles_over===1?'':'s')+' (ms)';
 rows('percentiles',Object.keys(s.percentiles).map(k=>[k,ms(s.percentiles[k].p50),ms(s.percentiles[k].p90),ms(s.percentiles[k].p99)]));
 rows('sessions',(s.sessions||[]).map(e=>[e.session,String(e.requests),ms(e.latency_p50_ms),ms(e.latency_p95_ms),String(e.delay_ticks),e.rtc_delay_predicted===undefined?'-':String(e.rtc_delay_predicted),String(e.fps)]));
 const svg=document.getElementById('plot'),W=760,H=280,L=50,B=20,T=12,R=10;let max=0;svg.replaceChildren();
 s.recent.forEach(r=>{let t=0;parts.forEach(p=>t+=r[p[0]]);max=Math.max(max,t)});
 const tk=niceTicks(max),top=tk.top,ph=H-B-T;
 tk.labels.forEach((lab,i)=>{const y=T+ph*(1-i/(tk.labels.length-1));svg.append(el('svg:line',{x1:L,y1:y,x2:W-R,y2:y,stroke:i?'#eee':'#999'}),el('svg:text',{class:'tick',x:L-6,y:y+4,'font-size':11,'text-anchor':'end'},lab))});
 svg.append(el('svg:line',{x1:L,y1:T,x2:L,y2:H-B,stroke:'#999'}));
 const n=s.recent.length,bw=n?Math.min(24,Math.max(2,(W-L-R-4)/n-2)):0;
 s.recent.forEach((r,i)=>{let y=H-B;const x=L+4+i*(bw+2);
  if(!r.ok){const g=el('svg:g',{class:'fail'}),c=x+bw/2,h=Math.max(3,Math.min(6,bw/2+1));g.append(el('svg:title',{},'failed: '+r.reason+' ('+r.protocol+', '+ms(r.request)+' ms)'),el('svg:rect',{x:x,y:T,width:bw,height:ph,fill:FAIL,'fill-opacity':0.12}),el('svg:path',{d:'M'+(c-h)+' '+(H-B-2*h-2)+'l'+2*h+' '+2*h+'m0 '+(-2*h)+'l'+(-2*h)+' '+2*h,stroke:FAIL,'stroke-width':2}));svg.append(g);return}
  parts.forEach(p=>{const h=ph*r[p[0]]/top;y-=h;svg.append(el('svg:rect',{x:x,y:y,width:bw,height:h,fill:p[1]}))})});
 svg.append(el('svg:text',{x:L+4,y:H-4,'font-size':11,fill:'#666'},'oldest'),el('svg:text',{x:W-R,y:H-4,'font-size':11,fill:'#666','text-anchor':'end'},'newest'));
 const lg=document.getElementById('legend');lg.replaceChildren();
 parts.concat([['failed request',FAIL]]).forEach(p=>{const sp=el('span'),i=el('i');i.style.background=p[1];sp.append(i,document.createTextNode(p[0]));lg.append(sp)})}
function tick(){fetch('status.json').then(r=>r.json()).then(draw).catch(()=>{})}
tick();setInterval(tick,2000);
