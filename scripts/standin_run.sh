# Sourced by test_floor.sh and test_colab.sh: notebook 01b runs once per model a machine without the Hub can have,
# the packaged copy (install.sh converts it; chosen by default) in the script's main run, then the stand-in
# (random weights), named by COURSE_MODEL_SOURCE. `plan_standin_run ARGS...` splits the script's arguments:
# OPTIONS gets the options (they go to both runs); PATHS_GIVEN is yes when a test path is among them; STANDIN_RUN
# is yes when no path is given, or when one of the paths holds 01b.
NB01B=notebooks/01b_real_models_qlora.ipynb
plan_standin_run() {
  OPTIONS=(); PATHS_GIVEN=no; STANDIN_RUN=no
  local arg path
  for arg in "$@"; do
    path="${arg%%::*}"; path="${path%/}"
    if [ ! -e "$path" ]; then OPTIONS+=("$arg")
    else
      PATHS_GIVEN=yes
      if [ "$NB01B" = "$path" ] || [ "${NB01B#"$path"/}" != "$NB01B" ]; then STANDIN_RUN=yes; fi
    fi
  done
  if [ "$PATHS_GIVEN" = no ]; then STANDIN_RUN=yes; fi
}
