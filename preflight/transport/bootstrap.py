"""The bootstrap: the few lines of Python every node runs first (`python3 -S -c BOOTSTRAP`), which read the
probe bundle (from stdin, or from a verified file) and run it. preflight.transport.bundle builds what it
reads and reads what it prints; its module docstring is the wire protocol."""

from typing import List

# Runs on the node as `python3 -S -c BOOTSTRAP` (FLAGS). Python 3.8+, standard library only. Kept small: it is
# sent on every connection. It also arms the safety nets: the whole process group is killed when stdin
# reaches EOF (the controller went away), when the config's deadline passes, or when the controller
# does not send the next phase's config within `wait_s` (default 60 s; the transports send the phase's
# longest deadline + 30 s) of a result that asked for one. Once the last result is in hand (the lock
# _F, held until then, is free: the probe and its children are done) an EOF is the controller done
# with us, not gone: the main thread writes the result and exits 0 (the deadline still guards the
# write), never a kill of our own group racing our own exit (a Kubernetes attach closes stdin right
# after the result, stdinOnce; a rank killed there exits 9 and failed its Job).
# It ends with os._exit, also when the run raises (SystemExit: the bench agent's on SIGTERM, its ranks
# stopped): an interpreter's normal exit waited for the deadline's timer thread (a task that Slurm's
# preemption had signalled lived on until KillWait's SIGKILL, its srun and preflight waiting on it), and
# with daemon timers it aborted (SIGABRT) on the stdin reader blocked in readline at finalization.
# The bundle (a zip that preflight.transport.bundle writes: deflated, no comment, no zip64) is read by _Zip, the
# few lines of the format it needs (PKWARE APPNOTE.TXT 4.3: end record, central directory, local headers; each
# entry's CRC-32 checked as zipfile does), not by zipfile: importing zipfile pulled in pathlib, urllib.parse and
# importlib.util, 12-16 ms of CPU on every node for nothing a probe uses (benchmarks/node_bundle_cpu.py).
# shutil (the probes' context imports it) imports bz2 and lzma if it can (2 ms of CPU, their C libraries loaded):
# it is imported here with them kept out, and they are importable again after.
# A module runs from the bytecode the controller compiled (bytecode/<path>c, a marshalled code object)
# when the node's Python has the controller's magic number (bytecode/MAGIC), else from its source.

#: the interpreter's options before `-c BOOTSTRAP`. -S: no `site`, so no .pth file in the node's site-packages runs
#: inside the probe (conda's, setuptools' distutils-precedence.pth, editable installs' finders, one that imports
#: certifi): node code the probe has no use for, and CPU (most of what they import that a probe run does not
#: import itself). The probes are standard library only; what looks for installed packages (the driver probe's
#: NCCL wheel and torch) reads the same site-packages directories without running them (preflight.probe.sitedirs).
#: The all-reduce's ranks, which import torch, are interpreters of their own, started without -S (bench_agent).
FLAGS = ("-S",)


def bootstrap_argv(python: str) -> List[str]:
    """The node's bootstrap process: `python -S -c BOOTSTRAP` (FLAGS say why -S)."""
    return [python] + list(FLAGS) + ["-c", BOOTSTRAP]


BOOTSTRAP = r"""
import sys
for _m in('bz2','lzma'):sys.modules.setdefault(_m,None)
import os,json,time,signal,threading,queue,shutil,marshal,zlib,base64,struct
for _m in('bz2','lzma'):
    if sys.modules[_m] is None:del sys.modules[_m]
try:from _frozen_importlib import spec_from_loader as _sl;from _frozen_importlib_external import MAGIC_NUMBER as _MG
except ImportError:from importlib.util import spec_from_loader as _sl,MAGIC_NUMBER as _MG
class _Zip:
    def __init__(s,b):
        e=len(b)-22
        if e<0 or b[e:e+4]!=b'PK\5\6':raise ValueError('bundle: no zip end record (%d bytes)'%len(b))
        n,_,p=struct.unpack_from('<HII',b,e+10);s.b=b;s.f={}
        for _ in range(n):
            h=struct.unpack_from('<4s6H3I5H2I',b,p)
            if h[0]!=b'PK\1\2':raise ValueError('bundle: bad zip directory at %d'%p)
            s.f[b[p+46:p+46+h[10]].decode()]=h;p+=46+h[10]+h[11]+h[12]
    def read(s,k):
        h=s.f[k];q=h[16];l,x=struct.unpack_from('<HH',s.b,q+26);q+=30+l+x;d=s.b[q:q+h[8]]
        if h[4]==8:d=zlib.decompress(d,-15)
        elif h[4]:raise ValueError('bundle: %s: compression method %d'%(k,h[4]))
        if zlib.crc32(d)!=h[7]:raise ValueError('bundle: %s: CRC mismatch'%k)
        return d
sys.stdout.write('preflight-clock %r\n'%time.time());sys.stdout.flush()
_in=sys.stdin.buffer;_c=json.loads(_in.readline());_h=_in.readline()
def _file(p,d,ask=False):
    import hashlib,stat,errno
    q,b=os.path.split(p);u=os.getuid()
    def no(w):
        if ask:_why.append(w);return None
        sys.stdout.write('preflight-bundle-refused %s: %s\n'%(p,w));sys.stdout.flush();os._exit(3)
    try:f=os.open(p,os.O_RDONLY|os.O_NOFOLLOW|os.O_NONBLOCK)
    except OSError as e:return no('a symbolic link' if e.errno==errno.ELOOP else e.strerror)
    s=os.fstat(f)
    if not stat.S_ISREG(s.st_mode) or s.st_uid!=u or s.st_mode&0o022:
        os.close(f)
        if not stat.S_ISREG(s.st_mode):return no('not a regular file')
        if s.st_uid!=u:return no('owned by uid %d, not %d'%(s.st_uid,u))
        return no('writable by group or others (mode %o)'%(s.st_mode&0o777))
    with os.fdopen(f,'rb') as fh:z=fh.read()
    if hashlib.sha256(z).hexdigest()!=d:
        try:os.unlink(p)
        except OSError:pass
        return no('SHA-256 %s, expected %s (removed)'%(hashlib.sha256(z).hexdigest()[:16],d[:16]))
    _prune(q,b,u)
    return z
def _prune(q,b,u):
    for o in os.listdir(q):
        if o!=b and o.startswith(b[:b.rindex('-')+1]):
            try:
                if os.lstat(os.path.join(q,o)).st_uid==u:os.unlink(os.path.join(q,o))
            except OSError:pass
_why=[]
def _ask(h):
    import hashlib
    d,n=h[1:].decode().split();p='/dev/shm/preflight-%d-bundle-%s.zip'%(os.getuid(),d)
    z=_file(p,d,True)
    if z is not None:return z
    sys.stdout.write('preflight-bundle-send %s: %s\n'%(p,_why[-1]));sys.stdout.flush();z=_in.read(int(n))
    if hashlib.sha256(z).hexdigest()!=d:
        sys.stdout.write('preflight-bundle-refused stdin: %d bytes with SHA-256 %s, expected %s\n'%(len(z),hashlib.sha256(z).hexdigest()[:16],d[:16]));sys.stdout.flush();os._exit(3)
    t='%s.%d.tmp'%(p,os.getpid())
    try:
        f=os.open(t,os.O_WRONLY|os.O_CREAT|os.O_EXCL|os.O_NOFOLLOW,0o600)
        try:
            v=memoryview(z)
            while v:v=v[os.write(f,v):]
        finally:os.close(f)
        os.rename(t,p);_prune(*os.path.split(p),os.getuid())
    except OSError as e:
        try:os.unlink(t)
        except OSError:pass
        sys.stdout.write('preflight-bundle-unsaved %s: %s\n'%(p,e.strerror));sys.stdout.flush()
    return z
def _at(h):
    d,p=h[1:].decode().split(' ',1);return _file(p.strip(),d)
_zb=_at(_h) if _h[:1]==b'@' else _ask(_h) if _h[:1]==b'?' else _in.read(int(_h))
_z=_Zip(_zb);_S={};_N=_z.f
_B='bytecode/MAGIC' in _N and _z.read('bytecode/MAGIC')==_MG
for _n in _N:
    if _n.endswith('.py'):
        _m=_n[:-3].replace('/','.');_p=_m.endswith('.__init__')
        _S[_m[:-9] if _p else _m]=(_n,_p)
class _L:
    @staticmethod
    def find_spec(name,path=None,target=None):
        if name in _S:return _sl(name,_L,origin='bundle:'+_S[name][0],is_package=_S[name][1])
    @staticmethod
    def create_module(spec):return None
    @staticmethod
    def exec_module(mod):
        n,p=_S[mod.__name__];c='bytecode/'+n+'c'
        if _B and c in _N:mod.__cached__='bundle:'+c;exec(marshal.loads(_z.read(c)),mod.__dict__)
        else:exec(compile(_z.read(n),'bundle/'+n,'exec'),mod.__dict__)
    @staticmethod
    def get_source(name):return _z.read(_S[name][0]).decode()
sys.meta_path.insert(0,_L)
def _pick(c):
    if 'z' in c:c=json.loads(zlib.decompress(base64.b64decode(c['z'])))
    if 'groups' not in c:return c
    for _g,_x in c['groups']:
        if os.environ.get('SLURMD_NODENAME') in _g:return _x
_cfg=_pick(_c)
def _die(*a):
    try:os.killpg(os.getpgrp(),signal.SIGKILL)
    finally:os._exit(137)
_F=threading.Lock();_F.acquire()
_Q=queue.Queue()
def _watch():
    try:
        for _l in iter(_in.readline,b''):_Q.put(_l)
    except Exception:pass
    if _F.acquire(False):return
    _die()
threading.Thread(target=_watch,daemon=True).start()
from preflight.probe.runner import main
_t=None;_x=0
try:
  while _cfg:
    if _t:_t.cancel()
    _t=threading.Timer(float(_cfg.get('deadline_s',600)),_die);_t.daemon=True;_t.start()
    _r=base64.b64encode(zlib.compress(json.dumps(main(_cfg,_zb)).encode(),1)).decode();_k=int(_cfg.get('line_max') or len(_r));_n=-(-len(_r)//_k)
    if not _cfg.get('more'):_F.release()
    for _i in range(_n-1):sys.stdout.write('preflight-part %d %s\n'%(_i,_r[_i*_k:_i*_k+_k]))
    sys.stdout.write('preflight-result %d %d %08x %s\n'%(_n-1,len(_r),zlib.crc32(_r.encode()),_r[(_n-1)*_k:]));sys.stdout.flush()
    if not _cfg.get('more'):break
    _t.cancel();_t=threading.Timer(float(_cfg.get('wait_s',60)),_die);_t.daemon=True;_t.start()
    _cfg=_pick(json.loads(_Q.get()))
except SystemExit as _e:_x=_e.code if isinstance(_e.code,int) else 1
except BaseException:
  import traceback;traceback.print_exc();_x=1
try:sys.stdout.flush();sys.stderr.flush()
finally:os._exit(_x)
"""
