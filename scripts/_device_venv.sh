# Sourced by the scripts that run on an offline host with the device image (scripts/gpu-*.sh): a venv
# from $py that sees the image's own packages, the wheels carried in .whl/, and servedeck from this
# checkout. Needs: py (interpreter), venv (path), repo (checkout), OUT (logs).
echo "=== venv from the repo ($venv, system site packages for what the image has)"
rm -rf "$venv"
"$py" -m venv --system-site-packages "$venv" || exit 2
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# When $py is itself a venv's (the device image's python3 is /opt/torch/.venv's), "system site
# packages" means the base interpreter's, not that venv's: see its site-packages through a .pth.
"$py" -c 'import sys; [print(p) for p in sys.path if p.endswith("-packages")]' >"$site/host-python-packages.pth"
if ls "$repo"/.whl/*.whl >/dev/null 2>&1; then
  "$venv/bin/python" -m pip install -q --no-index --no-deps --no-compile "$repo"/.whl/*.whl || exit 2
fi
# servedeck itself, editable; where pip cannot build offline, the same thing by hand: a .pth to src/.
if ! "$venv/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation -e "$repo" 2>"$OUT/pip-editable.log"; then
  echo "$repo/src" >"$site/servedeck-src.pth"
  echo "(pip could not install servedeck editable offline: put $repo/src on the path instead)"
fi
